"""The drained list: nodes fenced off from jobs until a person takes them back.

`pycli drain NODE --reason TEXT` records a node of one cluster, with why and when, in
`$PYCLI_STATE/drained/<name>.cluster.json` where the inventory names the cluster
(`pycli_cluster_name`, or `pycli_local_cluster` for a local one), so that moving or renaming the
inventory file keeps the list; else in `<inventory name>-<digest of its path>.json` (a list
kept there before the inventory named its cluster is read, and moved on its next change).
`pycli undrain NODE` takes it back. `train`, `bench` and `hostfile` leave drained nodes out and say so in one line;
`provision` still provisions them (that is how a node is repaired), and `check` and
`inventory show` list them. `check --deep --fence` puts the nodes its gates name there too.

Every change reads, changes and writes the list back under an exclusive lock (flock on a file
beside it), so a `pycli drain` beside a `check --fence` never loses the other's entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from pycli.cluster.model import Cluster, Drained
from pycli.core.errors import BadInput
from pycli.core.paths import state_dir

# A reason is one line that a person reads back in every command that leaves the node out.
MAX_REASON = 200


def drained_file_of(name: str) -> Path:
    """Where the drained list of the cluster called `name` lives (a name no inventory file's list
    takes: those end in a digest, these in ".cluster.json")."""
    return state_dir() / "drained" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.cluster.json"


def _path_file(inventory: Path) -> Path:
    """The list of an inventory that names no cluster: after the file and its absolute path, so two
    inventories of the same name never share a list."""
    path = inventory.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return state_dir() / "drained" / f"{path.stem or path.name}-{digest}.json"


def drained_file(cluster: Cluster) -> Path:
    """Where the cluster's drained list lives: after its name where the inventory gives one."""
    return drained_file_of(cluster.name) if cluster.name else _path_file(cluster.inventory_path)


def _file_to_read(cluster: Cluster) -> Path:
    path = drained_file(cluster)
    if not path.is_file() and cluster.name:
        return _path_file(cluster.inventory_path)  # kept before the inventory named its cluster
    return path


def read_drained(cluster: Cluster) -> tuple[Drained, ...]:
    """The cluster's drained list (empty when it has none); a damaged file is one line."""
    path = _file_to_read(cluster)
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text())
        return tuple(Drained(node=str(e["node"]), reason=str(e["reason"]), since=str(e["since"])) for e in data["drained"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise BadInput(f"{path} is not a drained list pycli wrote; remove it to undrain every node of "
                       f"{cluster.inventory_path}") from None


def _write(cluster: Cluster, entries: Sequence[Drained]) -> None:
    path, before = drained_file(cluster), _file_to_read(cluster)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"inventory": str(cluster.inventory_path.resolve()), "drained": [asdict(e) for e in entries]},
                              indent=2) + "\n")
    os.replace(tmp, path)
    if before != path:
        before.unlink(missing_ok=True)  # moved to the cluster's name


def forget_drained(name: str, inventory: Path) -> None:
    """A local cluster removed: a new one of that name, or in that file, starts with none drained."""
    drained_file_of(name).unlink(missing_ok=True)
    _path_file(inventory).unlink(missing_ok=True)


@contextmanager
def _changing(cluster: Cluster) -> Iterator[list[Drained]]:
    """The drained list to change in place, written back on leaving; one change at a time."""
    path = drained_file(cluster)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = list(read_drained(cluster))
        yield entries
        _write(cluster, entries)


def with_drained(cluster: Cluster) -> Cluster:
    """`cluster` with its drained list (of the hosts it still has)."""
    names = {host.name for host in cluster.hosts}
    return replace(cluster, drained=tuple(e for e in read_drained(cluster) if e.node in names))


def _known(cluster: Cluster, nodes: Sequence[str]) -> None:
    if not nodes:
        raise BadInput("name the node(s), as the inventory names them")
    names = [host.name for host in cluster.hosts]
    unknown = [node for node in nodes if node not in names]
    if unknown:
        raise BadInput(f"{', '.join(unknown)}: not a host of {cluster.inventory_path} (its hosts: {', '.join(names)})")


def stamp(now: datetime | None = None) -> str:
    """A drained entry's time: UTC, ISO 8601 to the second."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _put(entries: list[Drained], node: str, reason: str, since: str) -> Drained:
    """Put one node on `entries` (a node already there gets the new reason, keeps its time)."""
    for index, entry in enumerate(entries):
        if entry.node == node:
            entries[index] = Drained(node, reason, entry.since)
            return entries[index]
    entries.append(Drained(node, reason, since))
    return entries[-1]


def drain(cluster: Cluster, nodes: Sequence[str], reason: str, now: datetime | None = None) -> list[Drained]:
    """Put `nodes` on the drained list with a person's reason: one line of at most MAX_REASON characters."""
    _known(cluster, nodes)
    reason = " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON:
        raise BadInput(f"--reason: say in one line of at most {MAX_REASON} characters why the node is drained")
    with _changing(cluster) as entries:
        return [_put(entries, node, reason, stamp(now)) for node in nodes]


FENCE_PREFIX = "pycli check --deep: "
_FENCE_MORE = "… (all of it in check.json)"


def fence_reason(why: str) -> str:
    """What the drained list keeps of a gate's reason: one line, shortened to MAX_REASON."""
    reason = FENCE_PREFIX + " ".join(why.split())
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - len(_FENCE_MORE)].rstrip() + _FENCE_MORE


def fence(cluster: Cluster, suspects: Mapping[str, str], now: datetime | None = None) -> list[Drained]:
    """`check --deep --fence`: every node the gates named goes on the list in one change, each with
    its gate's reason shortened (the check's report keeps all of it); it never stops half-way."""
    _known(cluster, list(suspects))
    with _changing(cluster) as entries:
        return [_put(entries, node, fence_reason(why), stamp(now)) for node, why in suspects.items()]


def undrain(cluster: Cluster, nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take `nodes` off the drained list: (taken back, were not drained)."""
    _known(cluster, nodes)
    with _changing(cluster) as entries:
        drained = {e.node for e in entries}
        entries[:] = [e for e in entries if e.node not in nodes]
    return [n for n in nodes if n in drained], [n for n in nodes if n not in drained]


def leaving_out_line(cluster: Cluster) -> str | None:
    """The one line a command that runs jobs says when it leaves drained nodes out."""
    if not cluster.drained:
        return None
    them = "it" if len(cluster.drained) == 1 else "them"
    return (f"leaving out drained {', '.join(e.describe() for e in cluster.drained)}; "
            f"'pycli undrain {' '.join(e.node for e in cluster.drained)}' takes {them} back")


def for_jobs(cluster: Cluster, say: Callable[[str], None]) -> Cluster:
    """The cluster a job, a benchmark or a hostfile uses: drained nodes left out, and said."""
    if (line := leaving_out_line(cluster)) is not None:
        say(line)
    return cluster.for_jobs()
