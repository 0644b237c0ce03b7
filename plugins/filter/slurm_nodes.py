"""What the slurm role reads from Slurm's and apt's output, as pure functions tested on recorded output.

slurm_apt_version: the slurmd version a node has or would get (`apt-cache policy slurmd`), which
the preflight compares across nodes; slurm_apt_installed: the one it has; slurm_apt_has and
slurm_version_matches: whether apt offers, and the node has, the version slurm_version pins.
slurm_upgrade_problem: why Slurm cannot go from one version to another in place.
slurm_node_problems: what is wrong with the nodes as slurmctld sees them, for the role's wait and
its verify step. slurm_node_lines: the NodeName lines of a slurm.conf by node, which a run keeps
for the nodes it did not reach.

`sinfo -N -h -o '%N|%T|%c|%E'` prints one line per node and partition: name, state (a `*`
suffix: not responding), CPUs and the reason it is down or drained. A node drained by a
person (or by pycli's gates) keeps its state; a node Slurm itself drained because it
registered with less than slurm.conf says is a configuration problem the role made.

pycli reads sinfo too (pycli/jobs/slurm.py, which nodes a job can start on); the role does not import
it, since it runs from a plain `ansible-playbook` without pycli installed.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping

SINFO_FORMAT = "%N|%T|%c|%E"
BAD_STATES = frozenset({"down", "unknown", "fail", "failing", "future", "inval"})
DRAIN_STATES = frozenset({"drained", "draining", "drain"})
# Reasons slurmctld gives when a node registers with less than its NodeName line says.
CONFIG_REASONS = ("Low RealMemory", "Low socket*core*thread count", "Low CPUs", "gres/", "Node unexpectedly rebooted")


NO_VERSION = "(none)"


def slurm_apt_version(policy_stdout: str) -> str:
    """The installed version (apt keeps it), else the candidate, else "(none)" (no such package in apt's lists).

    `apt-cache policy` run with LC_ALL=C: other locales translate "Installed" and "Candidate".
    """
    installed, candidate = _policy_field(policy_stdout, "Installed"), _policy_field(policy_stdout, "Candidate")
    return installed if installed != NO_VERSION else candidate


def _policy_field(policy_stdout: str, name: str) -> str:
    """A field of `apt-cache policy` (LC_ALL=C): "Installed" or "Candidate"; "(none)" where absent."""
    found = re.search(rf"^\s*{name}: (\S+)\s*$", policy_stdout, flags=re.MULTILINE)
    return found.group(1) if found else NO_VERSION


def slurm_node_problems(sinfo_stdout: str, expected: Mapping[str, object]) -> list[str]:
    """One line per node of `expected` (name -> CPUs in slurm.conf) that is not fit to run jobs."""
    seen: dict[str, tuple[str, str, str]] = {}
    for line in sinfo_stdout.splitlines():
        fields = line.strip().split("|", 3)
        if len(fields) == 4 and fields[0]:
            name, state, cpus, reason = fields
            seen.setdefault(name, (state.strip().lower(), cpus.strip(), reason.strip()))
    problems = []
    for name, want_cpus in expected.items():
        if name not in seen:
            problems.append(f"{name}: not in sinfo (not in slurmctld's slurm.conf)")
            continue
        state, cpus, reason = seen[name]
        base = state.rstrip("*~#!%$@^-+")
        why = f" ({reason})" if reason and reason != "none" else ""
        if state.endswith("*"):
            problems.append(f"{name}: {state}, slurmd does not answer slurmctld{why}")
        elif base in BAD_STATES:
            problems.append(f"{name}: {state}{why}")
        elif base in DRAIN_STATES and reason.startswith(CONFIG_REASONS):
            problems.append(f"{name}: {state} by Slurm: the node has less than slurm.conf says{why}")
        elif cpus != str(want_cpus):
            problems.append(f"{name}: {cpus} CPUs, slurm.conf says {want_cpus}")
    return problems


def slurm_apt_installed(policy_stdout: str) -> str:
    """The installed version of `apt-cache policy` (run with LC_ALL=C), or "(none)"."""
    return _policy_field(policy_stdout, "Installed")


def slurm_apt_has(policy_stdout: str, pattern: str) -> bool:
    """Whether the version table of `apt-cache policy` (LC_ALL=C) holds a version `pattern`
    matches (apt's own pattern for `package=version`: a glob, as "23.11*")."""
    table = policy_stdout.split("Version table:", 1)[1] if "Version table:" in policy_stdout else ""
    versions = re.findall(r"^\s*(?:\*\*\* )?(\S+) -?\d+\s*$", table, flags=re.MULTILINE)
    return any(fnmatch.fnmatchcase(version, pattern) for version in versions)


def slurm_version_matches(installed: str, pattern: str) -> bool:
    """Whether an installed version is the one `pattern` (slurm_version, a glob) names."""
    return installed != NO_VERSION and fnmatch.fnmatchcase(installed, pattern)


def slurm_pinned(package: str, version: str) -> str:
    """A package of __slurm_*_packages as the apt module installs it: Slurm's own at `version`
    (slurm_version) where one is set; munge, MariaDB and the rest as the distribution has them."""
    return f"{package}={version}" if version and package.startswith("slurm") else package


# Slurm's major releases before its six-month cycle (May and November from 24.05 on), in order.
_NINE_MONTH_MAJORS = ("17.02", "17.11", "18.08", "19.05", "20.02", "20.11", "21.08", "22.05", "23.02", "23.11")


def _major(version: str) -> tuple[int, int] | None:
    """(year, month) of a Debian package version or an apt pattern of Slurm: "22.05.8-4+deb12u3",
    "1:23.11.4-1", "24.11*" give (22, 5), (23, 11), (24, 11); None where it names none."""
    found = re.match(r"^(?:\d+:)?(\d{2})\.(\d{2})(?:[.*-]|$)", version.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def _major_index(major: tuple[int, int]) -> int | None:
    """Slurm's major releases counted in order, or None for a number Slurm never released."""
    name = f"{major[0]:02d}.{major[1]:02d}"
    if name in _NINE_MONTH_MAJORS:
        return _NINE_MONTH_MAJORS.index(name)
    if major >= (24, 5) and major[1] in (5, 11):
        return len(_NINE_MONTH_MAJORS) + (major[0] - 24) * 2 + (0 if major[1] == 5 else 1)
    return None


def slurm_upgrade_problem(installed: str, target: str) -> str:
    """Why Slurm cannot go in place from the installed version to `target`, or "" where it can.

    Slurm reads the state (jobs, the accounting database) of the two major releases before its
    own, and from 24.11 on of the three before; never of a later one (no downgrade). Nothing
    installed ("(none)"), the same major release, or a version pycli cannot read: no problem here.
    """
    was, to = _major(installed), _major(target)
    if installed == NO_VERSION or was is None or to is None or was == to:
        return ""
    old, new = _major_index(was), _major_index(to)
    if old is None or new is None:
        return ""
    name = f"{to[0]:02d}.{to[1]:02d}"
    if new < old:
        return (f"Slurm {installed} cannot go back to {target}: a Slurm daemon does not read the state "
                "files and database of a later release")
    if new - old > _window(new):
        reads = ", ".join(_major_name(index) for index in range(new - _window(new), new))
        furthest = max(index for index in range(old + 1, new) if index - old <= _window(index))
        return (f"Slurm {installed} cannot be upgraded to {target} in place: {name} reads the state of "
                f"{reads} only (jobs and accounting would be lost); upgrade to {_major_name(furthest)} first")
    return ""


def _window(index: int) -> int:
    """How many major releases before it a release reads the state of: 3 from 24.11 on, else 2."""
    return 3 if index >= len(_NINE_MONTH_MAJORS) + 1 else 2


def _major_name(index: int) -> str:
    if index < len(_NINE_MONTH_MAJORS):
        return _NINE_MONTH_MAJORS[index]
    later = index - len(_NINE_MONTH_MAJORS)
    return f"{24 + later // 2:02d}.{'05' if later % 2 == 0 else '11'}"


_NODE_LINE = re.compile(r"^NodeName=(\S+)\s.*$")


def slurm_node_lines(slurm_conf: str) -> dict[str, str]:
    """{node: its whole NodeName line} of a slurm.conf the role wrote (one node a line; the
    DEFAULT pseudo-node and lines naming several nodes at once are not the role's)."""
    found = {}
    for line in slurm_conf.splitlines():
        match = _NODE_LINE.match(line.strip())
        if match and match.group(1) != "DEFAULT" and not re.search(r"[\[,]", match.group(1)):
            found[match.group(1)] = line.strip()
    return found


class FilterModule:
    def filters(self):
        return {"slurm_apt_version": slurm_apt_version, "slurm_apt_installed": slurm_apt_installed,
                "slurm_apt_has": slurm_apt_has, "slurm_pinned": slurm_pinned, "slurm_version_matches": slurm_version_matches,
                "slurm_upgrade_problem": slurm_upgrade_problem, "slurm_node_problems": slurm_node_problems,
                "slurm_node_lines": slurm_node_lines}
