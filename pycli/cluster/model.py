"""The cluster model: one parsed view of an inventory that every command uses.

An inventory is read through Ansible's own loader (INI, YAML, a directory, group_vars and
host_vars next to it; pycli.cluster.ansible_inventory), so pycli sees exactly the hosts and values a
playbook would. The
conventions every command follows: group `nodes` holds every training host; group `launcher`
(optional) names where jobs start, else the first of `nodes`; host var `slots` is the number
of processes on that host. Every problem found is reported at once, as BadInput (exit 2),
before any host is touched.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pycli.cluster.ansible_inventory import read_with_ansible
from pycli.cluster.inventory_writer import (
    LAUNCHER_GROUP,
    MONITORING_GROUP,
    NODES_GROUP,
    PACKAGE_CACHE_GROUP,
    SLURM_CONTROLLER_GROUP,
    HostEntry,
)
from pycli.core.errors import NEXT_RELEASE, BadInput, problems_error
from pycli.core.tree import plugin

DEFAULT_SSH_PORT = 22
# Later the GPU count found on the host; until a host has been looked at, one process.
DEFAULT_SLOTS = 1

# Ansible's own names for the connection settings, newest first (the ansible_ssh_* forms
# are older aliases Ansible still honours).
ADDRESS_VARS = ("ansible_host", "ansible_ssh_host")
PORT_VARS = ("ansible_port", "ansible_ssh_port")
USER_VARS = ("ansible_user", "ansible_ssh_user")
SLOTS_VAR = "slots"
KEY_VARS = ("ansible_ssh_private_key_file", "ansible_private_key_file")
SSH_ARGS_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
# Ansible's way to say "this machine": a host whose connection is `local` runs its commands here
# without SSH (pycli.cluster.nodes.node_argv).
CONNECTION_VAR = "ansible_connection"
LOCAL_CONNECTION = "local"
# Cluster-wide settings commands read besides the hosts (from the launcher's variables).
# Where the venv and the work folder are on every node; their defaults are the common role's
# (pycli.jobs.launch.NodeLayout reads them from roles/common/defaults/main.yml).
VENV_VAR = "common_venv_path"
WORK_DIR_VAR = "common_work_dir"
INTERFACE_VAR = "pycli_network_interface"
# Nodes that share one machine's cores (local clusters): measurements run one node at a time.
SHARED_CPUS_VAR = "pycli_nodes_share_cpus"
# The slurm role's switch for pycli's node gate (health check, prolog, epilog; on by default).
NODE_GATE_VAR = "slurm_node_gate"
# How many job folders (and staged files) a node keeps (pycli.jobs.files).
JOBS_KEPT_VAR = "pycli_jobs_kept"
# The cluster's name, the first one set (the roles take the same: ssh_trust_cluster_name): the
# inventory's own, else a local cluster's (`pycli cluster up` writes it).
CLUSTER_NAME_VAR = "pycli_cluster_name"
LOCAL_CLUSTER_VAR = "pycli_local_cluster"
SETTINGS_VARS = (VENV_VAR, WORK_DIR_VAR, INTERFACE_VAR, SHARED_CPUS_VAR, NODE_GATE_VAR, JOBS_KEPT_VAR, CLUSTER_NAME_VAR,
                 LOCAL_CLUSTER_VAR)
# Where Alertmanager posts alerts (role monitoring): checked here, so a bad one is one line
# before provisioning starts, not a failed play; by the rule the role's preflight checks it with.
WEBHOOK_VAR = "monitoring_alert_webhook_url"
# Every variable pycli reads; Ansible templates them ("{{ ... }}") before pycli sees them.
READ_VARS = (*ADDRESS_VARS, *PORT_VARS, *USER_VARS, SLOTS_VAR, *KEY_VARS, *SSH_ARGS_VARS, CONNECTION_VAR, *SETTINGS_VARS,
             WEBHOOK_VAR)

_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# Linux's rule for a device name (at most 15 characters; no '/', ':' or blank), narrowed
# to what real interfaces are called: it reaches launchers' command lines and NCCL/Gloo.
_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}$")
# A login name as useradd takes it (a final '$' for machine accounts), at most 32 characters.
_LOGIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,30}\$?$")
_DIGITS = re.compile(r"^[0-9]+$")
_MAX_HOSTNAME = 253


@dataclass(frozen=True)
class Host:
    """One training host: how to reach it and how many processes it runs."""

    name: str
    address: str
    port: int = DEFAULT_SSH_PORT
    user: str | None = None  # None: whoever runs pycli, as plain `ssh` would
    slots: int = DEFAULT_SLOTS
    # OpenSSH options that reach the host as Ansible reaches it (key, known_hosts, jump hosts).
    ssh_options: tuple[str, ...] = ()
    # ansible_connection=local: the machine pycli runs on; its commands run here, never over SSH.
    local: bool = False

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def login_user(self) -> str:
        # A local host's commands run as whoever runs pycli, as Ansible's local connection does.
        return current_user() if self.local else self.user or current_user()


@dataclass(frozen=True)
class Drained:
    """A node fenced off from jobs (pycli/cluster/drained.py keeps the list): which, why and since when."""

    node: str
    reason: str
    since: str  # UTC, ISO 8601 to the second

    def describe(self) -> str:
        return f"{self.node} ({self.reason}; since {self.since})"


@dataclass(frozen=True)
class Cluster:
    """The training hosts in inventory order and the one that starts jobs."""

    hosts: tuple[Host, ...]
    launcher: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    # The inventory it was read from: playbooks and ad-hoc commands run against it. Not part
    # of what the cluster is (two reads of the same hosts are equal wherever they came from).
    inventory: Path | None = field(default=None, compare=False)
    # Hosts of the inventory that jobs leave out until they are undrained (`for_jobs`).
    drained: tuple[Drained, ...] = ()
    # The first host of group `slurm_controller` (slurmctld, slurmdbd): the inventory opts in to Slurm.
    slurm_controller: str | None = None
    # The group's second host, where one is named: the backup slurmctld (SlurmctldHost's second line).
    slurm_backup: str | None = None
    # The host of group `monitoring` (Prometheus, Alertmanager): the inventory opts in to monitoring.
    monitoring_host: str | None = None

    @property
    def has_slurm(self) -> bool:
        return self.slurm_controller is not None

    @property
    def slurm_controllers(self) -> tuple[str, ...]:
        """Where slurmctld runs: the primary, then the backup where there is one."""
        return tuple(name for name in (self.slurm_controller, self.slurm_backup) if name is not None)

    @property
    def name(self) -> str:
        """The cluster's name as its inventory gives it; "" where it gives none."""
        return next((str(self.settings[var]).strip() for var in (CLUSTER_NAME_VAR, LOCAL_CLUSTER_VAR)
                     if str(self.settings.get(var) or "").strip()), "")

    @property
    def total_slots(self) -> int:
        return sum(host.slots for host in self.hosts)

    @property
    def launcher_host(self) -> Host:
        return next(host for host in self.hosts if host.name == self.launcher)

    @property
    def nodes_share_cpus(self) -> bool:
        """The inventory says its nodes share one machine's cores (a local cluster)."""
        return str(self.settings.get(SHARED_CPUS_VAR, "")).strip().lower() in ("true", "yes", "1")

    @property
    def slurm_node_gate(self) -> bool:
        """Slurm runs pycli's node gate on the nodes, its epilog too: unless the inventory turns it off."""
        return str(self.settings.get(NODE_GATE_VAR, "true")).strip().lower() not in ("false", "no", "0", "off")

    def for_jobs(self) -> Cluster:
        """The cluster jobs run on: drained hosts left out, the launcher the first host left if
        it was drained itself; every host drained is bad input."""
        if not self.drained:
            return self
        out = {entry.node for entry in self.drained}
        hosts = tuple(host for host in self.hosts if host.name not in out)
        if not hosts:
            raise BadInput(f"every node is drained ({', '.join(e.describe() for e in self.drained)}); "
                           "'pycli undrain NODE' takes one back")
        launcher = self.launcher if self.launcher not in out else hosts[0].name
        return replace(self, hosts=hosts, launcher=launcher, drained=())

    @property
    def inventory_path(self) -> Path:
        """The inventory Ansible reads for this cluster; only a cluster read from one has it."""
        if self.inventory is None:
            raise ValueError("this cluster was not read from an inventory; Ansible cannot reach its hosts")
        return self.inventory


def current_user() -> str:
    return getpass.getuser()


# ---------------------------------------------------------------- checks (pure)


def positive_int(value: object) -> int | None:
    """`value` as a positive integer, or None; accepts the digit strings YAML/INI quoting leaves."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = int(value)
    elif isinstance(value, str) and _DIGITS.match(value.strip()):
        number = int(value.strip())
    else:
        return None
    return number if number > 0 else None


def port_number(value: object) -> int | None:
    number = positive_int(value)
    return number if number is not None and number <= 65535 else None


def address_problem(address: str) -> str | None:
    """Why `address` cannot name a host on the network, or None when it can."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    labels = address.split(".")
    if len(address) <= _MAX_HOSTNAME and all(_DNS_LABEL.match(label) for label in labels):
        return None
    return (
        f"{address!r} is not a valid host name (each dot-separated part: 1-63 letters, digits "
        "or '-', not starting or ending with '-') nor an IP address"
    )


def interface_problem(name: str) -> str | None:
    """Why `name` cannot be a network interface's name, or None when it can."""
    if _INTERFACE_NAME.match(name):
        return None
    return f"{name!r} is not a network interface name (1-15 letters, digits, '_', '.', '@' or '-', not starting with '-' or '.')"


def login_name_problem(name: str) -> str | None:
    """Why `name` cannot be a login name on a node, or None when it can."""
    if len(name) <= 32 and _LOGIN_NAME.match(name):
        return None
    return (f"{name!r} is not a login name (a letter or '_', then letters, digits, '_', '.' or '-', "
            "a final '$' allowed; 32 at most)")


def cluster_problems(hosts: Sequence[Host], launcher: str | None) -> list[str]:
    """Every reason the hosts cannot form a cluster, each saying what to change."""
    if not hosts:
        return [f"group '{NODES_GROUP}' has no hosts; list every training host under [{NODES_GROUP}]"]
    problems = []
    for host in hosts:
        if (why := address_problem(host.address)) is not None:
            fix = "rename it" if host.address == host.name else "fix its ansible_host"
            problems.append(f"host {host.name!r}: {why}; {fix}")
    problems += duplicate_problems(hosts)
    if (why := launcher_problem(launcher, [host.name for host in hosts])) is not None:
        problems.append(why)
    return problems


def launcher_problem(launcher: str | None, node_names: Sequence[str]) -> str | None:
    if launcher is None or launcher in node_names:
        return None
    return (
        f"launcher {launcher!r} is not in group '{NODES_GROUP}'; "
        f"name one of the training hosts ({_some_names(node_names)}) as launcher"
    )


# What each opt-in group's host is called, where it runs what, why it must be a node too, and
# how many hosts it may name: Slurm's controller may have a backup (the group's second host).
_OPT_IN_HOSTS = {
    SLURM_CONTROLLER_GROUP: ("slurm controller", "where slurmctld and slurmdbd run", "it runs slurmd too"),
    MONITORING_GROUP: ("monitoring host", "where Prometheus and Alertmanager run", "it runs node-exporter too"),
}
_OPT_IN_AT_MOST = {SLURM_CONTROLLER_GROUP: (2, "one or two: the primary, where slurmctld and slurmdbd run, "
                                               "then its backup, where a second slurmctld waits")}


def opt_in_problem(group: str, names: Sequence[str], node_names: Sequence[str]) -> str | None:
    """Why an opt-in group (slurm_controller, monitoring) cannot name its hosts, or None when it can
    (or is absent)."""
    called, where, why = _OPT_IN_HOSTS[group]
    at_most, say = _OPT_IN_AT_MOST.get(group, (1, f"exactly one, {where}"))
    if len(names) > at_most:
        return f"group '{group}' names {len(names)} hosts ({_some_names(names)}); name {say}"
    for name in names:
        if name not in node_names:
            return (f"{called} {name!r} (group '{group}') is not in group '{NODES_GROUP}'; "
                    f"name one of the training hosts ({_some_names(node_names)}): {why}")
    return None


def webhook_problem(value: object) -> str | None:
    """Why a monitoring_alert_webhook_url is no URL Alertmanager can post to, or None."""
    # The monitoring role's preflight takes exactly these (its test plugin, pycli.cluster.webhook_url).
    if value in (None, "") or plugin("test", "webhook_url").webhook_url(value):
        return None
    return f"{WEBHOOK_VAR} {str(value)!r} is not an http:// or https:// URL; give the address that takes the alerts"


def duplicate_problems(hosts: Sequence[Host]) -> list[str]:
    """The same name twice, or two names that reach the same address and SSH port."""
    problems = []
    first_by_name: dict[str, Host] = {}
    first_by_endpoint: dict[str, Host] = {}
    for host in hosts:
        if host.name in first_by_name:
            problems.append(f"host {host.name!r} is listed twice; list each host once")
            continue
        first_by_name[host.name] = host
        if (other := first_by_endpoint.get(host.endpoint)) is not None:
            problems.append(
                f"hosts {other.name!r} and {host.name!r} both reach {host.endpoint}; "
                "remove one, or give each its own ansible_host or ansible_port"
            )
        else:
            first_by_endpoint[host.endpoint] = host
    return problems


def _some_names(names: Sequence[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def make_cluster(hosts: Sequence[Host], launcher: str | None, *, source: str) -> Cluster:
    """The cluster, or BadInput listing every problem; the launcher defaults to the first host."""
    if problems := cluster_problems(hosts, launcher):
        raise problems_error(source, problems)
    return Cluster(hosts=tuple(hosts), launcher=launcher or hosts[0].name)


# ------------------------------------------------- host variables -> Host (pure)


def _first_set(variables: Mapping[str, Any], names: Sequence[str]) -> Any:
    name = _first_set_name(variables, names)
    return None if name is None else variables[name]


def _first_set_name(variables: Mapping[str, Any], names: Sequence[str]) -> str | None:
    return next((name for name in names if variables.get(name) not in (None, "")), None)


def host_from_vars(name: str, variables: Mapping[str, Any]) -> tuple[Host | None, list[str]]:
    """A Host from its merged Ansible variables, or the problems that prevent it."""
    problems = []
    address = _first_set(variables, ADDRESS_VARS)
    address = name if address is None else str(address)
    raw_port = _first_set(variables, PORT_VARS)
    port = DEFAULT_SSH_PORT if raw_port is None else port_number(raw_port)
    if port is None:
        problems.append(f"host {name!r}: ansible_port must be a port number (1-65535), got {raw_port!r}")
    user = _first_set(variables, USER_VARS)
    if user is not None and (why := login_name_problem(str(user))) is not None:
        problems.append(f"host {name!r}: {_first_set_name(variables, USER_VARS)} {why}")
    interface = variables.get(INTERFACE_VAR)
    if interface not in (None, "") and (why := interface_problem(str(interface))) is not None:
        problems.append(f"host {name!r}: {INTERFACE_VAR} {why}")
    raw_slots = variables.get(SLOTS_VAR)
    slots = DEFAULT_SLOTS if raw_slots is None else positive_int(raw_slots)
    if slots is None:
        problems.append(
            f"host {name!r}: {SLOTS_VAR} must be a positive integer (processes on the host), "
            f"got {raw_slots!r}; set {SLOTS_VAR}=1 or more"
        )
    ssh_options: list[str] = []
    key = _first_set(variables, KEY_VARS)
    if key is not None:
        ssh_options += ["-i", os.path.expanduser(str(key))]
    for var in SSH_ARGS_VARS:
        if variables.get(var):
            try:
                ssh_options += shlex.split(str(variables[var]))
            except ValueError as exc:
                problems.append(f"host {name!r}: {var} cannot be split into arguments ({exc})")
    if problems or port is None or slots is None:
        return None, problems
    local = str(variables.get(CONNECTION_VAR) or "").strip() == LOCAL_CONNECTION
    return Host(
        name=str(name), address=address, port=port, user=None if user is None else str(user), slots=slots,
        ssh_options=tuple(ssh_options), local=local,
    ), []


# ----------------------------------------------- `--hosts` host lists (pure)

# [user@]host[:port], where host may be an [IPv6] address in brackets.
_HOST_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<ipv6>[^\]]+)\]|(?P<host>[^:@\s\[\]]+))(?::(?P<slots>[^:]*))?$")
# Before release 0.3.0, `--hosts host:N` was an SSH port; slots that many on one host are refused, so
# a port typed the old way is said, not taken as slots. No server runs a thousand ranks.
HOST_LIST_SLOTS_MAX = 1024


def parse_host_list(text: str) -> list[HostEntry]:
    """Host lines from `--hosts a,user@b:4,c`: each `[user@]host[:slots]`, slots as in horovodrun's -H."""
    source = f"--hosts {text!r}"
    entries: list[HostEntry] = []
    problems = []
    for item in (part.strip() for part in text.split(",")):
        match = _HOST_SPEC.match(item)
        if not match:
            problems.append(f"{item!r} is not [user@]host[:slots]" if item else "an empty entry between commas")
            continue
        if match["user"] is not None and (why := login_name_problem(match["user"])) is not None:
            problems.append(f"{item!r}: {why}")
            continue
        slots = None
        if match["slots"] is not None:
            slots = positive_int(match["slots"])
            if slots is None:
                problems.append(f"{item!r}: slots must be a positive integer (host:slots, as horovodrun -H)")
                continue
            if slots > HOST_LIST_SLOTS_MAX:
                problems.append(f"{item!r}: {slots} slots? host:N is the host's slots (as horovodrun -H); "
                                f"its SSH port is --port (host:PORT until release {NEXT_RELEASE})")
                continue
        entries.append(HostEntry(name=match["ipv6"] or match["host"], user=match["user"], slots=slots))
    if problems:
        raise problems_error(source, problems)
    return entries


# ------------------------------------------------------- reading with Ansible


def load_cluster(path: Path | str) -> Cluster:
    """Read an inventory (file or directory) with Ansible and check it as a training cluster."""
    path = Path(path)
    source = str(path)
    _check_readable(path)
    groups, host_vars, problems = read_with_ansible(path, READ_VARS)
    if NODES_GROUP not in groups:
        found = ", ".join(sorted(name for name in groups if name not in ("all", "ungrouped"))) or "none"
        problems.append(
            f"no group '{NODES_GROUP}' (groups found: {found}); put every training host under "
            f"[{NODES_GROUP}], or make the existing groups its children with [{NODES_GROUP}:children]"
        )
        raise problems_error(source, problems)
    hosts = []
    for name in groups[NODES_GROUP]:
        host, host_problems = host_from_vars(name, host_vars[name])
        problems += host_problems
        if host is not None:
            hosts.append(host)
    launcher_names = groups.get(LAUNCHER_GROUP, [])
    launcher = launcher_names[0] if launcher_names else None
    if len(launcher_names) > 1:
        problems.append(
            f"group '{LAUNCHER_GROUP}' names {len(launcher_names)} hosts ({_some_names(launcher_names)}); "
            "name exactly one, where jobs start"
        )
    # Checked against every name in `nodes`, so a host with a bad variable is not also
    # reported as missing; the launcher check runs once, here.
    if (why := launcher_problem(launcher, groups[NODES_GROUP])) is not None:
        problems.append(why)
    opt_in = {group: groups.get(group, []) for group in _OPT_IN_HOSTS}
    problems += [why for group, names in opt_in.items() if (why := opt_in_problem(group, names, groups[NODES_GROUP]))]
    if len(caches := groups.get(PACKAGE_CACHE_GROUP, [])) > 1:
        problems.append(f"group '{PACKAGE_CACHE_GROUP}' names {len(caches)} hosts ({_some_names(caches)}); "
                        "name exactly one, where the cluster's packages are cached")
    problems += sorted({why for name in groups[NODES_GROUP] if (why := webhook_problem(host_vars[name].get(WEBHOOK_VAR)))})
    if hosts or not groups[NODES_GROUP]:
        problems += cluster_problems(hosts, launcher=None)
    if problems:
        raise problems_error(source, problems)
    launcher = launcher or hosts[0].name
    settings = {var: host_vars[launcher][var] for var in SETTINGS_VARS if host_vars[launcher].get(var) not in (None, "")}
    return Cluster(hosts=tuple(hosts), launcher=launcher, settings=settings, inventory=path,
                   slurm_controller=next(iter(opt_in[SLURM_CONTROLLER_GROUP]), None),
                   slurm_backup=next(iter(opt_in[SLURM_CONTROLLER_GROUP][1:]), None),
                   monitoring_host=next(iter(opt_in[MONITORING_GROUP]), None))


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise BadInput(f"{path}: no such inventory; write one with 'pycli inventory new --output {path} --hosts ...'")
    wanted = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, wanted):
        raise BadInput(f"{path}: cannot read the inventory (permission denied); check its owner and mode")
