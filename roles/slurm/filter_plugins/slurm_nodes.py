"""What the slurm role reads from Slurm's and apt's output, as pure functions tested on recorded output.

slurm_apt_version: the slurmd version a node has or would get (`apt-cache policy slurmd`), which
the preflight compares across nodes. slurm_node_problems: what is wrong with the nodes as
slurmctld sees them, for the role's wait and its verify step. slurm_node_lines: the NodeName
lines of a slurm.conf by node, which a run keeps for the nodes it did not reach.

`sinfo -N -h -o '%N|%T|%c|%E'` prints one line per node and partition: name, state (a `*`
suffix: not responding), CPUs and the reason it is down or drained. A node drained by a
person (or by pycli's gates) keeps its state; a node Slurm itself drained because it
registered with less than slurm.conf says is a configuration problem the role made.

pycli reads sinfo too (pycli/jobs/slurm.py, which nodes a job can start on); the role does not import
it, since it runs from a plain `ansible-playbook` without pycli installed.
"""

from __future__ import annotations

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
    found = dict(re.findall(r"^\s*(Installed|Candidate): (\S+)\s*$", policy_stdout, flags=re.MULTILINE))
    installed, candidate = found.get("Installed", NO_VERSION), found.get("Candidate", NO_VERSION)
    return installed if installed != NO_VERSION else candidate


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
        return {"slurm_apt_version": slurm_apt_version, "slurm_node_problems": slurm_node_problems,
                "slurm_node_lines": slurm_node_lines}
