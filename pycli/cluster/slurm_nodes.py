"""The one place that knows Slurm's node states: sinfo's answer as pycli reads it, drain and
resume, Slurm's hostlists ("node[1-3]") and its free text made printable. Pure, as
pycli.jobs.slurm (the jobs' side): the commands run on a node over SSH (pycli.cluster.slurm_state),
and the parsers are tested on Slurm 22.05's own output. In the cluster layer, so that provision,
health, top and drain reach Slurm's node states without the jobs' side.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Node states a job cannot start on (sinfo's long names, lower case, flags after '+' dropped).
UNAVAILABLE = ("down", "drained", "draining", "fail", "failing", "future", "inval", "maint", "not_responding",
               "power_down", "powered_down", "reboot_issued", "unknown")
# Node states a job runs in (or still ends in): a check leaves such a node alone.
BUSY = ("allocated", "mixed", "completing", "draining")

# sinfo, one line per node: name, state (long), reason, GRES; '|' cannot be in any of them but the reason.
SINFO_NODES_COMMAND = "sinfo -h -N -o '%N|%T|%G|%E'"
# Each node's partitions: sinfo -N lists a node once for each partition it is in.
SINFO_PARTITIONS_COMMAND = "sinfo -h -N -o '%N|%R'"


@dataclass(frozen=True)
class NodeState:
    node: str
    state: str  # sinfo's long state, lower case: idle, allocated, mixed, drained, draining, down, ...
    gpus: int  # gres gpu:N of the node
    reason: str  # why drained or down ("none" otherwise)

    @property
    def base(self) -> str:
        """The state without its flags ("mixed*" and "mixed+drain" are "mixed")."""
        return self.state.rstrip("*~#!%$@^-").split("+")[0]

    @property
    def available(self) -> bool:
        """Jobs can start on it (its state names none of UNAVAILABLE)."""
        return self.base not in UNAVAILABLE and not self.state.endswith("*")

    @property
    def answering(self) -> bool:
        """slurmctld hears from its slurmd: not flagged "*" (no answer to the last ping), not down or
        of unknown state (a slurmd that has not registered since slurmctld started)."""
        return not self.state.endswith("*") and self.base not in ("down", "unknown", "not_responding")

    @property
    def busy(self) -> bool:
        """A job runs on it, or is being cleaned up after (a draining node has one still)."""
        return self.base in BUSY


def _gres_gpus(gres: str) -> int:
    """The GPU count of a gres string such as "gpu:8", "gpu:h100:8(S:0-1)" or "(null)"."""
    count = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            count += int(fields[-1])
    return count


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, line breaks) as "?":
    Slurm's free text (job names, drain reasons) as pycli shows it."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def parse_sinfo_nodes(stdout: str) -> dict[str, NodeState]:
    """Nodes by name from SINFO_NODES_COMMAND (a node in two partitions is listed once)."""
    nodes: dict[str, NodeState] = {}
    for line in stdout.splitlines():
        parts = line.split("|", 3)
        if len(parts) != 4 or not parts[0].strip():
            continue
        name, state, gres, reason = (part.strip() for part in parts)
        nodes.setdefault(name, NodeState(name, state.lower(), _gres_gpus(gres), printable(reason)))
    return nodes


def parse_node_partitions(stdout: str) -> dict[str, tuple[str, ...]]:
    """node -> its partitions, in sinfo's order, from SINFO_PARTITIONS_COMMAND."""
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        name, _, partition = (part.strip() for part in line.partition("|"))
        if name and partition and partition not in found.setdefault(name, []):
            found[name].append(partition)
    return {name: tuple(partitions) for name, partitions in found.items()}


def by_partition(nodes: Sequence[str], partitions: Mapping[str, Sequence[str]]) -> list[tuple[str | None, list[str]]]:
    """`nodes` in as few groups as there are partitions that hold them all, each group in one
    partition (a Slurm job, a hold included, runs in one): the partition with most of the nodes
    left first, of equals the first seen. Nodes of no known partition make one group of partition
    None (the default)."""
    left = list(nodes)
    groups: list[tuple[str | None, list[str]]] = []
    while left:
        counts: dict[str, int] = {}
        for node in left:
            for partition in partitions.get(node, ()):
                counts[partition] = counts.get(partition, 0) + 1
        if not counts:
            groups.append((None, left))
            break
        best = max(counts, key=counts.__getitem__)  # of equals, the first seen: the first node's first partition
        groups.append((best, [node for node in left if best in partitions.get(node, ())]))
        left = [node for node in left if best not in partitions.get(node, ())]
    return groups


def drain_command(nodes: Sequence[str], reason: str) -> str:
    """Slurm's DRAIN with pycli's reason: running jobs finish, no new one starts there."""
    return (f"scontrol update nodename={shlex.quote(','.join(nodes))} state=drain "
            f"reason={shlex.quote(reason or 'drained by pycli')}")


def resume_command(nodes: Sequence[str]) -> str:
    return f"scontrol update nodename={shlex.quote(','.join(nodes))} state=resume"


def unavailable(states: Mapping[str, NodeState], names: Sequence[str]) -> list[NodeState]:
    """Those of `names` Slurm will not start a job on, in the order given."""
    return [states[name] for name in names if name in states and not states[name].available]


def expand_hostlist(expression: str) -> list[str]:
    """The node names of a Slurm hostlist such as "node[1-3,7],gpu[01-02]" (squeue's %N), in order.

    Ranges keep their zero padding ("gpu[08-10]" is gpu08, gpu09, gpu10); a name without
    brackets stands for itself; "(null)" and "" are no node."""
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expression.strip()):
        if not item or item == "(null)":
            continue
        expansions = [""]
        for literal, inside in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            parts = [literal]
            if inside:
                parts = [literal + number for number in _range_names(inside)]
            expansions = [before + part for before in expansions for part in parts]
        names.extend(expansions)
    return names


def _range_names(inside: str) -> list[str]:
    numbers: list[str] = []
    for piece in inside.split(","):
        low, _, high = piece.partition("-")
        if not high:
            numbers.append(low)
            continue
        if not (low.isdigit() and high.isdigit()):
            numbers.append(piece)
            continue
        width = len(low) if low.startswith("0") else 0
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers
