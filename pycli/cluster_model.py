"""The cluster model: one parsed view of an inventory that every command uses.

An inventory is read through Ansible's own loader (INI, YAML, a directory, group_vars and
host_vars next to it), so pycli sees exactly the hosts and values a playbook would. The
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycli.errors import BadInput
from pycli.inventory_writer import LAUNCHER_GROUP, NODES_GROUP, HostEntry

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
# Cluster-wide settings commands read besides the hosts (from the launcher's variables).
SETTINGS_VARS = ("common_venv_path", "common_work_dir", "pycli_network_interface")

_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
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

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def login_user(self) -> str:
        return self.user or current_user()


@dataclass(frozen=True)
class Cluster:
    """The training hosts in inventory order and the one that starts jobs."""

    hosts: tuple[Host, ...]
    launcher: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    # The inventory it was read from: playbooks and ad-hoc commands run against it. Not part
    # of what the cluster is (two reads of the same hosts are equal wherever they came from).
    inventory: Path | None = field(default=None, compare=False)

    @property
    def total_slots(self) -> int:
        return sum(host.slots for host in self.hosts)

    @property
    def launcher_host(self) -> Host:
        return next(host for host in self.hosts if host.name == self.launcher)

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


@dataclass(frozen=True)
class Located:
    """A problem at a known place (file:line[:column]), shown there rather than at the source."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def problems_error(source: str, problems: Iterable[str | Located]) -> BadInput:
    """One BadInput for many problems: one line each, every line standing alone."""
    return BadInput("\n".join(str(p) if isinstance(p, Located) else f"{source}: {p}" for p in problems))


# ------------------------------------------------- host variables -> Host (pure)


def _first_set(variables: Mapping[str, Any], names: Sequence[str]) -> Any:
    return next((variables[name] for name in names if variables.get(name) not in (None, "")), None)


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
    if problems:
        return None, problems
    return Host(
        name=str(name), address=address, port=port, user=None if user is None else str(user), slots=slots,
        ssh_options=tuple(ssh_options),
    ), []


# ----------------------------------------------- `--hosts` host lists (pure)

# [user@]host[:port], where host may be an [IPv6] address in brackets.
_HOST_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<ipv6>[^\]]+)\]|(?P<host>[^:@\s\[\]]+))(?::(?P<port>[^:]*))?$")


def parse_host_list(text: str) -> list[HostEntry]:
    """Host lines from `--hosts a,user@b,c:2222`: each `[user@]host[:port]`."""
    source = f"--hosts {text!r}"
    entries: list[HostEntry] = []
    problems = []
    for item in (part.strip() for part in text.split(",")):
        match = _HOST_SPEC.match(item)
        if not match:
            problems.append(f"{item!r} is not [user@]host[:port]" if item else "an empty entry between commas")
            continue
        port = None
        if match["port"] is not None and (port := port_number(match["port"])) is None:
            problems.append(f"{item!r}: the SSH port must be a number from 1 to 65535")
            continue
        entries.append(HostEntry(name=match["ipv6"] or match["host"], port=port, user=match["user"]))
    if problems:
        raise problems_error(source, problems)
    return entries


# ------------------------------------------------------- reading with Ansible


def load_cluster(path: Path | str) -> Cluster:
    """Read an inventory (file or directory) with Ansible and check it as a training cluster."""
    path = Path(path)
    source = str(path)
    _check_readable(path)
    groups, host_vars, problems = _read_with_ansible(path)
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
    if hosts or not groups[NODES_GROUP]:
        problems += cluster_problems(hosts, launcher=None)
    if problems:
        raise problems_error(source, problems)
    launcher = launcher or hosts[0].name
    settings = {var: host_vars[launcher][var] for var in SETTINGS_VARS if host_vars[launcher].get(var) not in (None, "")}
    return Cluster(hosts=tuple(hosts), launcher=launcher, settings=settings, inventory=path)


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise BadInput(f"{path}: no such inventory; write one with 'pycli inventory new --output {path} --hosts ...'")
    wanted = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, wanted):
        raise BadInput(f"{path}: cannot read the inventory (permission denied); check its owner and mode")


def _read_with_ansible(path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]], list[str | Located]]:
    """Hosts of each group, in inventory order, and each host's merged inventory variables.

    Parse failures end here as BadInput with Ansible's own message. Ansible's warnings are
    captured rather than printed, so the user sees pycli's one clear report.
    """
    # Ansible's import costs about 0.4 s; only the commands that read an inventory pay it.
    # DeferredWarningContext and Origin are internal to ansible-core: this is the only place
    # that uses them, and pyproject pins ansible-core exactly.
    from ansible._internal._display_utils import DeferredWarningContext
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    loader = DataLoader()
    sources = [str(path.resolve())]
    as_given = _AsGiven(path)
    with DeferredWarningContext(variables={}) as captured:
        try:
            inventory = InventoryManager(loader=loader, sources=sources)
            if failures := _parse_failures(captured.get_warnings(), as_given):
                raise problems_error(str(path), failures)
            groups = {name: [host.name for host in group.get_hosts()] for name, group in inventory.groups.items()}
            variables, template_problems = _inventory_vars(inventory, loader, sources, groups.get(NODES_GROUP, []))
        except AnsibleError as exc:
            # Raised, not warned: a broken group_vars/host_vars file, or an ansible.cfg with
            # inventory_any_unparsed_is_failed (then the warnings still say why).
            failures = _parse_failures(captured.get_warnings(), as_given, raised=str(exc))
            raise problems_error(str(path), failures or [_ansible_error_problem(exc, as_given)]) from None
        problems: list[str | Located] = [*template_problems, *_duplicate_key_warnings(captured.get_warnings(), as_given)]
    problems += _ini_lines_set_twice(inventory, as_given)
    return groups, variables, problems


def _ansible_error_problem(error: BaseException, as_given: _AsGiven) -> str | Located:
    """Ansible's message for an error it raised, at the file:line[:column] it names."""
    from ansible._internal._datatag._tags import Origin
    from ansible.errors import AnsibleError

    message = str(error).splitlines()[0]
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, AnsibleError):
            obj = cause.obj
            origin = obj if isinstance(obj, Origin) else Origin.get_tag(obj)
            if origin is not None and origin.path:
                place = ":".join(str(part) for part in (origin.line_num, origin.col_num) if part)
                return Located(as_given(origin.path) + (f":{place}" if place else ""), f"Ansible cannot read it: {message}")
        cause = cause.__cause__ or cause.__context__
    return f"Ansible cannot read it: {message}"


class _AsGiven:
    """Ansible names files by absolute path; show them as the user named the inventory."""

    def __init__(self, path: Path) -> None:
        self._given, self._absolute = str(path), str(path.resolve())

    def __call__(self, where: str) -> str:
        return self._given + where[len(self._absolute):] if where.startswith(self._absolute) else where


def _inventory_vars(
    inventory: Any, loader: Any, sources: list[str], names: Iterable[str]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each host's variables as a playbook would see them from the inventory, and template problems.

    The same precedence as VariableManager.get_vars (ansible.cfg's `precedence` order of
    group levels, then the host's own), without play-adjacent vars, facts or extra vars,
    which are no part of the inventory. VariableManager recomputes every group's vars for
    every host; a cluster has few distinct group sets, so they are merged once per set:
    1,000 hosts load in about half its CPU time (benchmarks/inventory_show.py).
    """
    from ansible import constants as C
    from ansible.inventory.helpers import get_group_vars, sort_groups
    from ansible.template import Templar
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    def from_plugins(entities: list[Any]) -> dict[str, Any]:
        # group_vars/ and host_vars/ next to the inventory, as at task time
        return get_vars_from_inventory_sources(loader, sources, entities, "task")

    all_group = inventory.groups["all"]
    levels = {
        "all_inventory": lambda groups: all_group.get_vars(),
        "groups_inventory": lambda groups: get_group_vars(groups),
        "all_plugins_inventory": lambda groups: from_plugins([all_group]),
        "groups_plugins_inventory": lambda groups: from_plugins(groups),
    }
    by_group_set: dict[tuple[str, ...], dict[str, Any]] = {}
    merged: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in dict.fromkeys(names):
        host = inventory.get_host(name)
        groups = sort_groups([group for group in host.get_groups() if group.name != "all"])
        key = tuple(group.name for group in groups)
        if key not in by_group_set:
            group_vars: dict[str, Any] = {}
            for level in C.VARIABLE_PRECEDENCE:
                if level in levels:
                    group_vars = combine_vars(group_vars, levels[level](groups))
            by_group_set[key] = group_vars
        host_vars = combine_vars(combine_vars(by_group_set[key], host.get_vars()), from_plugins([host]))
        merged[name], template_problems = _resolve_templates(name, host_vars, lambda v: Templar(loader=loader, variables=v))
        problems += template_problems
    return merged, problems


def _resolve_templates(name: str, variables: dict[str, Any], templar_for: Any) -> tuple[dict[str, Any], list[str]]:
    """Template the values pycli reads ("{{ ... }}"), as Ansible does when it connects."""
    from ansible.errors import AnsibleError

    wanted = (*ADDRESS_VARS, *PORT_VARS, *USER_VARS, SLOTS_VAR, *KEY_VARS, *SSH_ARGS_VARS, *SETTINGS_VARS)
    templated = [var for var in wanted if isinstance(variables.get(var), str) and "{{" in variables[var]]
    if not templated:
        return variables, []
    templar = templar_for(variables)
    resolved, problems = dict(variables), []
    for var in templated:
        try:
            resolved[var] = templar.template(variables[var])
        except AnsibleError as exc:
            resolved.pop(var)
            problems.append(f"host {name!r}: {var} {str(variables[var])!r} cannot be resolved: {str(exc).splitlines()[0]}")
    return resolved, problems


# Ansible reports a source it could not read as a warning per plugin that tried, then
# "Unable to parse SOURCE as an inventory source"; these messages are how we read them back.
_PLUGIN_FAILED = re.compile(r"^Failed to parse inventory with '(?P<plugin>[^']+)' plugin")
_SOURCE_UNPARSED = re.compile(r"^Unable to parse (?P<source>.+) as an inventory source$")
# ... or, with inventory_any_unparsed_is_failed set, raised instead of that last warning.
_SOURCE_FAILED_RAISED = re.compile(r"^Completely failed to parse inventory source (?P<source>.+)$")
_NOT_AN_AUTO_CONFIG = "no root 'plugin' key found"
_ORIGIN_WITH_LINE = re.compile(r"^Origin: (?P<where>/[^\n]*?:\d+(?::\d+)?)$", re.M)
_YAML_SUFFIXES = (".yml", ".yaml", ".json")


def _parse_failures(warnings: Sequence[Any], as_given: _AsGiven, raised: str | None = None) -> list[str | Located]:
    """Ansible's reason for each inventory source it could not parse, with the line.

    `raised`: the message of an AnsibleError that cut the parsing short, if one did.
    """
    problems: list[str | Located] = []
    pending: list[tuple[str, list[Any]]] = []  # (plugin, event chain) of the source being read
    for warning in warnings:
        events = _event_chain(warning.event)
        top = events[0].msg or ""
        if match := _PLUGIN_FAILED.match(top):
            pending.append((match["plugin"], events[1:]))
        elif match := _SOURCE_UNPARSED.match(top):
            problems += _explain_unparsed(match["source"], pending, as_given)
            pending = []
    if pending and raised and (match := _SOURCE_FAILED_RAISED.match(raised)):
        problems += _explain_unparsed(match["source"], pending, as_given)
    return problems


# When several plugins fail on one file, the first of these that tried speaks for it.
_PLUGIN_PREFERENCE = ("yaml", "ini", "toml", "auto")


def _explain_unparsed(source: str, failures: list[tuple[str, list[Any]]], as_given: _AsGiven) -> list[str | Located]:
    relevant = [
        (plugin, events)
        for plugin, events in failures
        if not (plugin == "auto" and any(_NOT_AN_AUTO_CONFIG in (event.msg or "") for event in events))
        # The INI plugin tries every file; its complaint about a YAML file is noise.
        and not (plugin == "ini" and source.endswith(_YAML_SUFFIXES) and len(failures) > 1)
    ]
    if not relevant:
        return [Located(as_given(source), "Ansible found no inventory in it; write the hosts as INI or YAML")]
    relevant.sort(key=lambda failure: _PLUGIN_PREFERENCE.index(failure[0]) if failure[0] in _PLUGIN_PREFERENCE else 99)
    explained: dict[tuple[str, str], str] = {}  # (where, why) -> plugin: one line per distinct reason
    for plugin, events in relevant:
        explained.setdefault(_where_and_why(source, events), plugin)
    return [
        Located(as_given(where), f"Ansible cannot read this inventory ({plugin} plugin): {why}")
        for (where, why), plugin in explained.items()
    ]


def _event_chain(event: Any) -> list[Any]:
    chain = [event]
    while event.chain is not None:
        event = event.chain.event
        chain.append(event)
    return chain


def _where_and_why(source: str, events: list[Any]) -> tuple[str, str]:
    """The most precise place Ansible names (file:line[:column]) and its message there."""
    for event in events:
        if match := _ORIGIN_WITH_LINE.search(event.formatted_source_context or ""):
            return match["where"], event.msg
    # The INI plugin drops the line number before it reports; find the line its message quotes.
    message = events[-1].msg if events else "unknown error"
    line = _line_quoted_in(source, message)
    return (f"{source}:{line}" if line else source), message


_QUOTED = re.compile(r"'([^']+)'|got: (.+)$|(\[[^\]]+\])")


def _line_quoted_in(source: str, message: str) -> int | None:
    """The one line of `source` holding the text the message quotes, when exactly one does."""
    try:
        lines = Path(source).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for match in _QUOTED.finditer(message):
        quoted = next(group for group in match.groups() if group).strip()
        found = [
            number for number, line in enumerate(lines, start=1)
            if quoted == line.strip() or quoted in line.split() or (" " in quoted and quoted in line)
        ]
        if len(found) == 1:
            return found[0]
    return None


_DUPLICATE_KEY = "Found duplicate mapping key"


def _duplicate_key_warnings(warnings: Sequence[Any], as_given: _AsGiven) -> list[Located]:
    """YAML sources: Ansible warns on a key given twice (a host or a variable) and keeps the last."""
    problems = []
    for warning in warnings:
        for event in _event_chain(warning.event):
            if (event.msg or "").startswith(_DUPLICATE_KEY):
                match = _ORIGIN_WITH_LINE.search(event.formatted_source_context or "")
                where = as_given(match["where"]) if match else "inventory"
                advice = "Ansible keeps only the last one; list each host or variable once"
                problems.append(Located(where, f"{event.msg} {advice}"))
    return problems


def _ini_lines_set_twice(inventory: Any, as_given: _AsGiven) -> list[Located]:
    """INI sources: a host (or group variable) listed on two lines, found through Ansible's origin tags.

    Ansible merges repeated INI host lines silently. Each variable's name keeps the origin of
    the line that first set it and its value the origin of the line that set it last, so two
    different lines mean the host was listed twice. Limits: a repeated line without variables
    (`node1` twice, or `node1:2222` after `node1`, whose port Ansible drops) leaves no trace
    and cannot be seen; a host listed in two groups with the same variable on both lines is
    reported too, which is what we want: one place per setting.
    """
    from ansible._internal._datatag._tags import Origin

    def twice(owner: str, variables: Mapping[str, Any]) -> Iterable[Located]:
        for name, value in variables.items():
            first, last = Origin.get_tag(name), Origin.get_tag(value)
            # YAML origins carry a column; a key and its value may sit on different lines there.
            if first and last and first.col_num is None and last.col_num is None and first.path == last.path:
                if first.line_num != last.line_num:
                    yield Located(
                        f"{as_given(first.path)}:{last.line_num}",
                        f"{owner} sets {name} again (first on line {first.line_num}); "
                        "Ansible silently keeps this last one; list each host once",
                    )

    problems = []
    for host in inventory.hosts.values():
        problems += twice(f"host {host.name!r}", host.vars)
    for group in inventory.groups.values():
        problems += twice(f"group '{group.name}'", group.vars)
    return problems
