"""The one place that knows the launchers' host formats, both ways.

Out: an MPI hostfile (`host slots=N` per line, for `mpirun --hostfile`), a horovodrun host
list (`-H a:4,b:4`) and a DeepSpeed hostfile (`host slots=N`), from the cluster model.
In: an MPI or DeepSpeed hostfile, a plain list of one host per line (Volcano's
/etc/volcano/worker.host) or a horovodrun `-H` string, as host lines for `pycli inventory new`.

Hosts are named by address (ansible_host, else the inventory name): that is what Ansible
reaches, so it is the name the launcher can reach too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from pycli.cluster.inventory_writer import HostEntry
from pycli.cluster.model import Cluster, Host, positive_int
from pycli.core.errors import BadInput, Located, problems_error


def _slot_lines(hosts: Sequence[Host]) -> str:
    return "".join(f"{host.address} slots={host.slots}\n" for host in hosts)


def _horovod_list(hosts: Sequence[Host]) -> str:
    return ",".join(f"{host.address}:{host.slots}" for host in hosts) + "\n"


# DeepSpeed reads the same `host slots=N` lines as Open MPI; they are separate names
# because users think in launchers, and either may grow options of its own.
RENDERERS: dict[str, Callable[[Sequence[Host]], str]] = {
    "mpi": _slot_lines,
    "horovod": _horovod_list,
    "deepspeed": _slot_lines,
}
FORMATS = tuple(RENDERERS)


def check_format(name: str) -> str:
    if name not in RENDERERS:
        raise BadInput(f"unknown --format {name!r}; use one of {', '.join(FORMATS)}")
    return name


def fill_slots(cluster: Cluster, np: int | None) -> tuple[Host, ...]:
    """The hosts that run `np` processes, filled in inventory order like `mpirun --map-by slot`.

    Every host used but the last gets all its slots; the last gets only those still needed;
    hosts after it are left out. Without `np`, every host with all its slots.
    """
    if np is None:
        return cluster.hosts
    if np < 1:
        raise BadInput(f"--np {np}: the number of processes must be at least 1")
    if np > cluster.total_slots:
        raise BadInput(
            f"--np {np} is more than the {cluster.total_slots} slots of the cluster's "
            f"{len(cluster.hosts)} hosts; lower --np, or raise `slots` in the inventory"
        )
    return fill_hosts(cluster.hosts, np)


def fill_hosts(hosts: Sequence[Host], np: int) -> tuple[Host, ...]:
    """`hosts` with their slots filled in order up to `np` processes (fill_slots, checked there)."""
    used: list[Host] = []
    left = np
    for host in hosts:
        if left == 0:
            break
        take = min(host.slots, left)
        used.append(host if take == host.slots else replace(host, slots=take))
        left -= take
    return tuple(used)


def render_hostfile(hosts: Sequence[Host], format_name: str) -> str:
    """`hosts` in a launcher's format; refuses what the launcher would misread."""
    check_format(format_name)
    problems = []
    seen: dict[str, str] = {}
    for host in hosts:
        if host.address in seen:
            problems.append(
                f"hosts {seen[host.address]!r} and {host.name!r} share the address {host.address} "
                "(on different SSH ports); a launcher names hosts by address only, so give each its own"
            )
        seen.setdefault(host.address, host.name)
        if format_name == "horovod" and ":" in host.address:
            problems.append(
                f"host {host.name!r}: horovodrun -H cannot hold the IPv6 address {host.address}; "
                "use --format mpi, or give the host a DNS name as ansible_host"
            )
    if problems:
        raise problems_error("hostfile", problems)
    return RENDERERS[format_name](hosts)


# ------------------------------------------------------------------ reading


_HOSTFILE_OPTION = re.compile(r"^(?P<key>[A-Za-z_-]+)=(?P<value>.*)$")
# Open MPI's per-host limits: how many processes it may oversubscribe to, which a
# training cluster does not use, so they are read and left out.
_IGNORED_OPTIONS = {"max_slots", "max-slots"}


def parse_hostfile(text: str, *, source: str) -> list[HostEntry]:
    """Host lines from an MPI/DeepSpeed hostfile or a plain list of hosts, one per line.

    Accepts `host`, `host slots=N` (Open MPI, DeepSpeed) and `host:N` (MPICH, Intel MPI),
    with `#` comments. A host named twice is an error: Open MPI would add up its slots,
    which is rarely what a copied hostfile meant.
    """
    entries: list[HostEntry] = []
    problems: list[str | Located] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        name, slots_text = _split_host_colon_slots(words[0])
        for word in words[1:]:
            option = _HOSTFILE_OPTION.match(word)
            if option and option["key"] == "slots" and slots_text is None:
                slots_text = option["value"]
            elif not (option and option["key"] in _IGNORED_OPTIONS):
                problems.append(Located(where, f"{word!r} is not understood; a line is `host`, `host slots=N` or `host:N`"))
        entry, entry_problem = _entry(name, slots_text)
        if entry is None:
            problems.append(Located(where, str(entry_problem)))
        elif name in first_line:
            already = f"host {name!r} is already on line {first_line[name]}"
            problems.append(Located(where, f"{already}; list each host once, with slots=N"))
        else:
            first_line[name] = number
            entries.append(entry)
    if not entries and not problems:
        problems.append("no hosts in it; write one host per line, optionally with slots=N")
    if problems:
        raise problems_error(source, problems)
    return entries


def parse_horovod_hosts(text: str) -> list[HostEntry]:
    """Host lines from a horovodrun `-H a:4,b:4` string (`:N` may be left out)."""
    source = f"-H {text!r}"
    entries: list[HostEntry] = []
    problems: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            problems.append("an empty entry between commas; write host:slots,host:slots")
            continue
        entry, entry_problem = _entry(*_split_host_colon_slots(item))
        if entry is None:
            problems.append(str(entry_problem))
        elif any(known.name == entry.name for known in entries):
            problems.append(f"host {entry.name!r} is listed twice; list each host once")
        else:
            entries.append(entry)
    if problems:
        raise problems_error(source, problems)
    return entries


def _split_host_colon_slots(word: str) -> tuple[str, str | None]:
    # One colon is `host:slots`; more than one is an IPv6 address, which carries no slots here.
    if word.count(":") == 1:
        name, slots = word.split(":")
        return name, slots
    return word, None


def _entry(name: str, slots_text: str | None) -> tuple[HostEntry | None, str | None]:
    if not name:
        return None, "a host name is missing"
    if slots_text is None:
        return HostEntry(name=name), None
    slots = positive_int(slots_text)
    if slots is None:
        return None, f"host {name!r}: slots must be a positive integer, got {slots_text!r}"
    return HostEntry(name=name, slots=slots), None
