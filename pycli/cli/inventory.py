"""`pycli inventory new|show` and `pycli hostfile`: inventories in, launcher host lists out.

Argument parsing and printing only; reading and checking live in pycli.cluster.model, the
launcher formats in pycli.cluster.hostfiles, writing in pycli.cluster.inventory_writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import typer

from pycli.cli.options import INVENTORY_ARGUMENT, INVENTORY_OPTION, JSON_OPTION, load_inventory, output_option
from pycli.cluster import hostfiles
from pycli.cluster.drained import for_jobs
from pycli.cluster.inventory_writer import (
    PACKAGE_CACHE_FROM_HOSTS,
    HostEntry,
    opt_in_groups,
    render_inventory,
    write_text_atomically,
)
from pycli.cluster.model import (
    CONNECTION_VAR,
    DEFAULT_SLOTS,
    DEFAULT_SSH_PORT,
    LOCAL_CONNECTION,
    VENV_VAR,
    WORK_DIR_VAR,
    Cluster,
    Host,
    make_cluster,
    parse_host_list,
)
from pycli.core.errors import BadInput, notice, read_user_text, text_of
from pycli.jobs.launch import job_process_pattern
from pycli_node.gpu_reports import count_listed_gpus

inventory_app = typer.Typer(help="Write and read cluster inventories (hosts, SSH access, slots).", no_args_is_help=True)


# ------------------------------------------------------ pure: building `new`


@dataclass(frozen=True)
class ClusterSettings:
    """The cluster-wide settings of `inventory new`; a host's own value (from its line) wins."""

    slots: int | None = None
    user: str | None = None
    port: int | None = None
    key: str | None = None
    launcher: str | None = None
    venv: str | None = None  # the venv jobs run in on every host (VENV_VAR); None: the common role's
    work_dir: str | None = None  # the jobs' folder on every host (WORK_DIR_VAR); None: the common role's
    # Opt-in groups (inventory_writer.OPT_IN_GROUPS) naming the launcher: slurm_controller, monitoring.
    opt_in: tuple[str, ...] = ()


_HOW_TO_EDIT = [
    "Edit freely: one training host per line under [nodes], with ansible_host=, ansible_port=,",
    "ansible_user= or slots= where a host differs from the rest; cluster-wide settings under",
    "[nodes:vars]; [launcher] names the host where jobs start. Check it with",
    "'pycli inventory show FILE'; print launcher host lists with 'pycli hostfile FILE'.",
]


def new_inventory_text(entries: Sequence[HostEntry], settings: ClusterSettings, *, made_from: str) -> str:
    """The INI inventory for these host lines and settings, checked as a cluster first."""
    hosts = [
        Host(
            name=entry.name,
            address=entry.address or entry.name,
            port=entry.port or settings.port or DEFAULT_SSH_PORT,
            user=entry.user or settings.user,
            slots=entry.slots or settings.slots or DEFAULT_SLOTS,
        )
        for entry in entries
    ]
    make_cluster(hosts, settings.launcher, source=made_from)
    group_vars: dict[str, object] = {"slots": settings.slots or DEFAULT_SLOTS}
    if settings.user:
        group_vars["ansible_user"] = settings.user
    if settings.port:
        group_vars["ansible_port"] = settings.port
    if settings.key:
        group_vars["ansible_ssh_private_key_file"] = settings.key
    if settings.venv:
        group_vars[VENV_VAR] = settings.venv
    if settings.work_dir:
        group_vars[WORK_DIR_VAR] = settings.work_dir
    return render_inventory(
        entries,
        group_vars=group_vars,
        launcher=settings.launcher,
        opt_in={group: settings.launcher or entries[0].name for group in settings.opt_in},
        header=[f"Cluster inventory written by 'pycli inventory new' from {made_from}.", *_HOW_TO_EDIT],
        var_comments={
            "slots": "Processes per host (the GPU count on GPU hosts), unless a host line sets its own.",
            "ansible_user": "SSH user on every host.",
            "ansible_port": "SSH port on every host.",
            "ansible_ssh_private_key_file": "SSH private key for every host.",
            VENV_VAR: "The Python venv jobs run in (torch, Horovod): its bin/ comes first on the ranks' PATH.",
            WORK_DIR_VAR: "Where jobs keep their folders and staged files, the same path on every host.",
        },
    )


# The one host of `inventory new --local`. Named `localhost`, which every launcher takes for this
# machine without SSH: horovodrun's own default host (its -H names take no dots, so not
# 127.0.0.1), Open MPI's local node, and an address torchrun's rendezvous resolves.
LOCAL_HOST_NAME = "localhost"


def local_host_entry(python: str, root: bool = False) -> HostEntry:
    """The host line of this machine: Ansible's local connection, with the Python running pycli
    (its modules need nothing more than the controller has)."""
    extra = {CONNECTION_VAR: LOCAL_CONNECTION, "ansible_python_interpreter": python}
    if root:
        # The playbooks' `become: true` would run sudo, which root does not need and a bare
        # machine (a container, a cloud GPU VM) may not have; the inventory's word wins.
        extra["ansible_become"] = "false"
    return HostEntry(LOCAL_HOST_NAME, extra=extra)


def local_slots(slots: int | None, gpus: int) -> int:
    """Processes on this machine: --slots when given, else one per GPU, else one (a CPU host)."""
    return slots or gpus or DEFAULT_SLOTS


def gpus_here() -> int:
    """The GPUs `nvidia-smi -L` lists on this machine; 0 without nvidia-smi or a driver that answers."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return count_listed_gpus(listed.stdout) if listed.returncode == 0 else 0


def node_path(value: Path | None, flag: str, *, here: bool) -> str | None:
    """A --venv or --work-dir path as the inventory holds it: absolute (on this machine, `here`,
    a relative path or ~ is taken from where pycli runs; a remote host's path must be absolute)."""
    if value is None:
        return None
    path = value.expanduser().absolute() if here else value
    if not path.is_absolute():
        raise BadInput(f"{flag} {value}: give an absolute path on the hosts")
    return str(PurePosixPath(path))


def work_dir_path(value: Path | None, *, here: bool) -> str | None:
    """--work-dir as node_path takes it, and a folder a job's processes can be found by (their
    command lines name it: launch_lines.job_process_pattern)."""
    path = node_path(value, "--work-dir", here=here)
    if path is not None:
        try:
            job_process_pattern(PurePosixPath(path) / "jobs")
        except BadInput:
            raise BadInput(f"--work-dir {value}: only letters, digits, '_', '.', '-' and '/' may name it") from None
    return path


def _host_lines(hosts: str | None, hosts_file: Path | None, horovod_hosts: str | None) -> tuple[list[HostEntry], str]:
    """The host lines from the one source given, and how to name that source."""
    sources = {"--hosts": hosts, "--hosts-file": hosts_file, "--horovod-hosts": horovod_hosts}
    given = [flag for flag, value in sources.items() if value is not None]
    if len(given) != 1:
        named = f"{len(given)}: {', '.join(given)}" if given else "none"
        raise BadInput(f"give exactly one of --hosts, --hosts-file, --horovod-hosts or --local (got {named})")
    if hosts is not None:
        entries = parse_host_list(hosts)
        return entries, _shortened(f"--hosts {hosts}", entries)
    if horovod_hosts is not None:
        entries = hostfiles.parse_horovod_hosts(horovod_hosts)
        return entries, _shortened(f"horovodrun -H {horovod_hosts}", entries)
    assert hosts_file is not None
    if str(hosts_file) == "-":
        raw = getattr(sys.stdin, "buffer", None)  # bytes: a locale's decoding would hide binary input
        text = text_of(raw.read(), "--hosts-file -") if raw else sys.stdin.read()
        return hostfiles.parse_hostfile(text, source="<stdin>"), "a host list on stdin"
    text = read_user_text(hosts_file, f"--hosts-file {hosts_file}")
    return hostfiles.parse_hostfile(text, source=str(hosts_file)), f"the host file {hosts_file}"


def _shortened(described: str, entries: Sequence[HostEntry], longest: int = 72) -> str:
    # The description heads the inventory and every error line; a long list is summed up.
    if len(described) <= longest:
        return described
    return f"{described.split(' ', 1)[0]} with {len(entries)} hosts ({entries[0].name} ... {entries[-1].name})"


def _key_path(key: Path | None) -> str | None:
    if key is None:
        return None
    path = key.expanduser().absolute()
    if not path.is_file():
        raise BadInput(f"--key {key}: no such file; give the SSH private key that reaches the hosts")
    return str(path)


# ------------------------------------------------------------------ commands


@inventory_app.command("new")
def new_cmd(
    output: Path = output_option("Inventory file to write (refused if it exists, unless --force).", ..., dir_okay=False),
    hosts: str | None = typer.Option(
        None, "--hosts", help="Comma-separated hosts, each [user@]host[:slots] (slots as horovodrun -H; SSH port: --port)."
    ),
    hosts_file: Path | None = typer.Option(
        None,
        "--hosts-file",
        help="One host per line (Volcano's worker.host), or an MPI/DeepSpeed hostfile ('host slots=N'); '-' reads stdin.",
    ),
    horovod_hosts: str | None = typer.Option(None, "--horovod-hosts", help="A horovodrun -H list, e.g. 'a:4,b:4'."),
    slots: int | None = typer.Option(
        None, "--slots", min=1, help=f"Processes per host where the source gives none (default {DEFAULT_SLOTS})."
    ),
    user: str | None = typer.Option(None, "--user", "-u", help="SSH user on every host (default: whoever runs pycli)."),
    port: int | None = typer.Option(
        None, "--port", min=1, max=65535, help=f"SSH port on every host (default {DEFAULT_SSH_PORT})."
    ),
    key: Path | None = typer.Option(None, "--key", help="SSH private key for every host."),
    launcher_host: str | None = typer.Option(None, "--launcher-host", help="Host where jobs start (default: the first host)."),
    local: bool = typer.Option(
        False, "--local", help="This machine alone, reached without SSH (ansible_connection=local); "
        "slots: --slots, else its GPU count, else 1."
    ),
    venv: Path | None = typer.Option(
        None, "--venv", help=f"The Python venv jobs run in on every host ({VENV_VAR}; default: the one provisioning makes)."
    ),
    work_dir: Path | None = typer.Option(
        None, "--work-dir", help=f"Where jobs keep their folders on every host ({WORK_DIR_VAR}; default: the common role's)."
    ),
    slurm: bool = typer.Option(
        False, "--slurm", help="Opt in to Slurm: group slurm_controller with the launcher host (slurmctld, slurmdbd); "
        "provisioning installs Slurm on every host and 'pycli train' submits through it."
    ),
    monitoring: bool = typer.Option(
        False, "--monitoring", help="Opt in to monitoring: group monitoring with the launcher host (Prometheus, "
        "Alertmanager); provisioning installs node-exporter on every host."
    ),
    package_cache: bool | None = typer.Option(
        None, "--package-cache/--no-package-cache", help="The package cache: group package_cache with the launcher "
        f"host (nginx); every host's apt fetches through it (default: on from {PACKAGE_CACHE_FROM_HOSTS} hosts)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUTPUT if it exists."),
) -> None:
    """Write a plain, commented INI inventory of a host list, a hostfile, a horovodrun -H string or this machine (--local)."""
    if local:
        ssh_only = {"--hosts": hosts, "--hosts-file": hosts_file, "--horovod-hosts": horovod_hosts, "--user": user,
                    "--port": port, "--key": key, "--launcher-host": launcher_host}
        if given := [flag for flag, value in ssh_only.items() if value is not None]:
            raise BadInput(f"--local writes this machine alone, reached without SSH; leave out {', '.join(given)}")
        entries, made_from = [local_host_entry(sys.executable, root=os.geteuid() == 0)], "--local (this machine, no SSH)"
        slots = local_slots(slots, gpus_here())
    else:
        entries, made_from = _host_lines(hosts, hosts_file, horovod_hosts)
    settings = ClusterSettings(slots=slots, user=user, port=port, key=_key_path(key), launcher=launcher_host,
                               venv=node_path(venv, "--venv", here=local), work_dir=work_dir_path(work_dir, here=local),
                               opt_in=opt_in_groups(slurm=slurm, monitoring=monitoring,
                                                    package_cache=package_cache, hosts=len(entries)))
    text = new_inventory_text(entries, settings, made_from=made_from)
    write_text_atomically(output, text, force=force)
    print(f"wrote {output} ({len(entries)} hosts); check it with 'pycli inventory show {output}'")


def cluster_as_json(cluster: Cluster) -> dict[str, object]:
    drained = {entry.node: entry for entry in cluster.drained}
    return {
        "launcher": cluster.launcher,
        "total_slots": cluster.total_slots,
        "hosts": [
            {
                "name": host.name,
                "address": host.address,
                "user": host.login_user,
                "user_is_default": host.user is None,
                "port": host.port,
                "local": host.local,
                "slots": host.slots,
                "launcher": host.name == cluster.launcher,
                "drained": ({"reason": drained[host.name].reason, "since": drained[host.name].since}
                            if host.name in drained else None),
            }
            for host in cluster.hosts
        ],
    }


def cluster_table(cluster: Cluster) -> str:
    """Aligned columns, one host a line, then the totals: greppable, and instant for 1,000 hosts.

    (A rich Table spends about 0.5 s of CPU measuring 1,000 rows, a quarter of the 2 s budget.)
    """
    drained = {entry.node for entry in cluster.drained}
    headers = ("HOST", "ADDRESS", "USER", "PORT", "SLOTS", "LAUNCHER", *(("DRAINED",) if drained else ()))
    right_aligned = {3, 4}
    rows = [
        (
            host.name,
            host.address,
            host.user or f"{host.login_user} (current user)",
            "local" if host.local else str(host.port),  # reached without SSH
            str(host.slots),
            "yes" if host.name == cluster.launcher else "",
            *(("yes" if host.name in drained else "",) if drained else ()),
        )
        for host in cluster.hosts
    ]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if column in right_aligned else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    count = len(cluster.hosts)
    total = f"{count} host{'s' if count != 1 else ''}, {cluster.total_slots} slots in total, launcher {cluster.launcher}"
    notes = [f"drained: {entry.describe()}" for entry in cluster.drained]
    return "\n".join([line(headers), *(line(row) for row in rows), total, *notes]) + "\n"


@inventory_app.command("show")
def show_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Show the cluster an inventory describes: hosts, addresses, SSH user and port, slots, launcher, drained."""
    cluster = load_inventory(inventory, inventory_option)
    if as_json:
        print(json.dumps(cluster_as_json(cluster), indent=2))
        return
    sys.stdout.write(cluster_table(cluster))


def hostfile_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    format_name: str = typer.Option("mpi", "--format", help=f"One of: {', '.join(hostfiles.FORMATS)}."),
    np: int | None = typer.Option(None, "--np", help="Only enough hosts for NP processes, filled in inventory order."),
    output: Path | None = output_option("Write here (replaced if it exists) instead of printing.", dir_okay=False),
) -> None:
    """Print the cluster's hosts for a launcher: MPI or DeepSpeed hostfile, or horovodrun -H."""
    hostfiles.check_format(format_name)
    cluster = for_jobs(load_inventory(inventory, inventory_option), notice)
    hosts = hostfiles.fill_slots(cluster, np)
    text = hostfiles.render_hostfile(hosts, format_name)
    if output is None:
        sys.stdout.write(text)
        return
    # A hostfile is derived from the inventory, so writing it again is the normal case.
    write_text_atomically(output, text, force=True)
    print(f"wrote {output} ({len(hosts)} hosts, {sum(host.slots for host in hosts)} processes)")
