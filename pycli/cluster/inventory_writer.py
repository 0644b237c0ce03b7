"""The one place that writes inventories: plain, commented INI a person can read and edit.

Every command that produces an inventory (`pycli cluster up`, `pycli inventory new`) renders
it here, so they all look alike and Ansible's own INI loader reads them back unchanged.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pycli.core.errors import BadInput
from pycli.core.paths import role_defaults

# The groups the roles and playbooks work on: role cluster_groups's defaults, their one home.
_GROUPS = role_defaults("cluster_groups")
NODES_GROUP = str(_GROUPS["cluster_groups_nodes"])
# pycli's own: the host that starts a job's launcher (pycli train), no role's.
LAUNCHER_GROUP = "launcher"
# Opt-in to Slurm (role slurm): the one host of this group runs slurmctld and slurmdbd.
SLURM_CONTROLLER_GROUP = str(_GROUPS["cluster_groups_slurm_controller"])
# Opt-in to monitoring (role monitoring): the one host of this group runs Prometheus and Alertmanager.
MONITORING_GROUP = str(_GROUPS["cluster_groups_monitoring"])
# The package cache (role package_cache): the one host of this group runs it (nginx as a caching
# proxy). On by default from PACKAGE_CACHE_FROM_HOSTS hosts: docs/scale.md, "The package cache".
PACKAGE_CACHE_GROUP = str(_GROUPS["cluster_groups_package_cache"])
PACKAGE_CACHE_FROM_HOSTS = 8
# The opt-in groups, each naming one host (of `nodes`, but for package_cache, which may name any
# host the nodes reach), with the line the inventory says of it.
OPT_IN_GROUPS = {
    SLURM_CONTROLLER_GROUP: f"Slurm's controller (slurmctld, slurmdbd with MariaDB); every host of [{NODES_GROUP}] runs slurmd.",
    MONITORING_GROUP: f"Monitoring: Prometheus and Alertmanager; every host of [{NODES_GROUP}] runs node-exporter.",
    PACKAGE_CACHE_GROUP: f"Package cache (nginx): every host of [{NODES_GROUP}] fetches its packages through it.",
}



def opt_in_groups(*, slurm: bool = False, monitoring: bool = False, package_cache: bool | None = False,
                  hosts: int = 0) -> tuple[str, ...]:
    """The opt-in groups that `--slurm`, `--monitoring` and `--package-cache` ask for, in OPT_IN_GROUPS' order.
    package_cache None (neither --package-cache nor --no-package-cache): on for `hosts` of at least
    PACKAGE_CACHE_FROM_HOSTS."""
    if package_cache is None:
        package_cache = hosts >= PACKAGE_CACHE_FROM_HOSTS
    asked = {SLURM_CONTROLLER_GROUP: slurm, MONITORING_GROUP: monitoring, PACKAGE_CACHE_GROUP: package_cache}
    return tuple(group for group in OPT_IN_GROUPS if asked[group])


_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_./:@%+,~-]+$")


@dataclass(frozen=True)
class HostEntry:
    """One host line: its inventory name and the variables that differ per host."""

    name: str
    address: str | None = None
    port: int | None = None
    user: str | None = None
    slots: int | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    def variables(self) -> dict[str, object]:
        found: dict[str, object] = {}
        if self.address and self.address != self.name:
            found["ansible_host"] = self.address
        if self.port is not None:
            found["ansible_port"] = self.port
        if self.user:
            found["ansible_user"] = self.user
        if self.slots is not None:
            found["slots"] = self.slots
        found.update(self.extra)
        return found


def ini_value(value: object) -> str:
    """A value as Ansible's INI loader reads it back to the same thing."""
    if isinstance(value, (dict, list)):
        # Ansible reads a [group:vars] value with Python's literal_eval.
        text = repr(value)
        if "\n" in text:
            raise BadInput(f"value {text!r} spans lines and cannot be written to an INI inventory")
        return text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN_VALUE.match(text):
        return text
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    raise BadInput(f"value {text!r} holds both quote kinds and cannot be written to an INI inventory")


def _comment_block(lines: Iterable[str]) -> list[str]:
    return [f"# {line}".rstrip() for line in lines]


def render_inventory(
    hosts: Iterable[HostEntry],
    *,
    group_vars: Mapping[str, object] | None = None,
    launcher: str | None = None,
    opt_in: Mapping[str, str] | None = None,
    header: Iterable[str] = (),
    var_comments: Mapping[str, str] | None = None,
) -> str:
    """Render an INI inventory: group `nodes`, optional `launcher` and opt-in groups (OPT_IN_GROUPS: group -> its
    host), cluster-wide `[nodes:vars]`."""
    hosts = list(hosts)
    var_comments = var_comments or {}
    out = _comment_block(header)
    if out:
        out.append("")
    out.append("# Every training host. Per-host: ansible_host (address), ansible_port, ansible_user, slots.")
    out.append(f"[{NODES_GROUP}]")
    for host in hosts:
        pairs = " ".join(f"{key}={ini_value(val)}" for key, val in host.variables().items())
        out.append(f"{host.name} {pairs}".rstrip())
    if launcher:
        where = "# Where jobs start (mpirun/horovodrun run here); without it, the first node."
        out += ["", where, f"[{LAUNCHER_GROUP}]", launcher]
    for group, name in (opt_in or {}).items():
        out += ["", f"# {OPT_IN_GROUPS[group]}", f"[{group}]", name]
    if group_vars:
        out += ["", "# Settings for the whole cluster; a host line's own value wins.", f"[{NODES_GROUP}:vars]"]
        for key, val in group_vars.items():
            if key in var_comments:
                out.append(f"# {var_comments[key]}")
            out.append(f"{key}={ini_value(val)}")
    return "\n".join(out) + "\n"


def write_text_atomically(path: Path, text: str, *, force: bool = False, mode: int = 0o644) -> None:
    """Write `text` to `path` in one step; refuse to replace an existing file unless `force`."""
    if path.exists() and not force:
        raise BadInput(f"{path} already exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
