"""Reading an inventory with Ansible's own loader, its failures said where they are.

The one place that uses ansible-core's inventory internals (InventoryManager, the deferred
warnings, the origin tags on values); pyproject pins ansible-core exactly. pycli.cluster.model
turns what it reads into the cluster model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pycli.cluster.inventory_writer import NODES_GROUP
from pycli.core.errors import Located, problems_error


def read_with_ansible(
    path: Path, templated_vars: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]], list[str | Located]]:
    """Hosts of each group, in inventory order, and each host's merged inventory variables.

    Of the variables, `templated_vars` (those pycli reads) are templated as Ansible would.

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
            variables, template_problems = _inventory_vars(
                inventory, loader, sources, groups.get(NODES_GROUP, []), templated_vars
            )
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
    inventory: Any, loader: Any, sources: list[str], names: Iterable[str], templated_vars: Sequence[str]
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
        # group_vars/ and host_vars/ next to the inventory, as at task time (Ansible's functions are untyped)
        variables: dict[str, Any] = get_vars_from_inventory_sources(loader, sources, entities, "task")
        return variables

    all_group = inventory.groups["all"]
    levels: dict[str, Callable[[list[Any]], dict[str, Any]]] = {
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
        merged[name], template_problems = _resolve_templates(
            name, host_vars, lambda v: Templar(loader=loader, variables=v), templated_vars
        )
        problems += template_problems
    return merged, problems


def _resolve_templates(
    name: str, variables: dict[str, Any], templar_for: Any, wanted: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """Template the values pycli reads ("{{ ... }}"), as Ansible does when it connects."""
    from ansible.errors import AnsibleError

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
            if (first and last and first.col_num is None and last.col_num is None and first.path == last.path
                    and first.line_num != last.line_num):
                yield Located(
                    f"{as_given(first.path)}:{last.line_num}",
                    f"{owner} sets {name} again (first on line {first.line_num}); "
                    "Ansible silently keeps this last one; list each host once",
                )

    problems: list[Located] = []
    for host in inventory.hosts.values():
        problems += twice(f"host {host.name!r}", host.vars)
    for group in inventory.groups.values():
        problems += twice(f"group '{group.name}'", group.vars)
    return problems


def hosts_matching(path: Path, limit: str) -> list[str]:
    """The hosts of the inventory that `--limit limit` leaves, as Ansible reads the pattern
    (groups, wildcards, `!` and `&`, `~regex`, `@file`, the implicit localhost)."""
    from ansible._internal._display_utils import DeferredWarningContext
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    from pycli.core.errors import BadInput

    with DeferredWarningContext(variables={}):  # "could not match ..." is pycli's to say
        try:
            inventory = InventoryManager(loader=DataLoader(), sources=[str(path.resolve())])
            implicit = [host.name for host in inventory.list_hosts(limit) if host.implicit]
            inventory.subset(limit)
            return [host.name for host in inventory.get_hosts("all")] + implicit
        except AnsibleError as exc:
            raise BadInput(f"--limit {limit!r}: {str(exc).splitlines()[0]}") from None


def hosts_targeted(path: Path, pattern: str = "all", limit: str | None = None) -> list[str]:
    """The inventory's hosts that a run over `pattern` with `--limit limit` works on (a
    playbook's run: pattern "all"; its plays may take fewer)."""
    from ansible._internal._display_utils import DeferredWarningContext
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    from pycli.core.errors import BadInput

    with DeferredWarningContext(variables={}):  # Ansible says its own warnings when it runs
        try:
            inventory = InventoryManager(loader=DataLoader(), sources=[str(path.resolve())])
            if limit:
                inventory.subset(limit)
            return [host.name for host in inventory.get_hosts(pattern)]
        except AnsibleError as exc:
            limited = f" --limit {limit!r}" if limit else ""
            raise BadInput(f"{path}: hosts {pattern!r}{limited}: {str(exc).splitlines()[0]}") from None
