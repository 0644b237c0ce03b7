"""Slurm's view of the cluster's nodes, asked over SSH, for every command that needs it (train,
check, bench, drain, undrain, provision, top) without going through the jobs' side: the nodes'
states and reasons (sinfo), and pycli's drains and resumes set in Slurm. Command lines and
parsers: pycli.cluster.slurm_nodes. Slurm's client tools answer on any node, and reach the backup
slurmctld where the primary does not answer (both are in every node's slurm.conf): Slurm is asked,
and told, on the launcher node, else on a controller or the next node that answers (ask_slurm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pycli.cluster import slurm_nodes
from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import connection_lost, ssh_each
from pycli.core.errors import PycliError


def ask_slurm(cluster: Cluster, command: str) -> tuple[Host, str]:
    """`command` (Slurm's client tools) on the launcher node, else, where SSH cannot reach it, on the
    controller or the next node that answers: the node that answered and what it printed. A
    failure of Slurm's own (slurmctld down) would be the same on every node: raised at once."""
    first = [cluster.launcher, *cluster.slurm_controllers]
    order = sorted(cluster.hosts, key=lambda host: first.index(host.name) if host.name in first else len(first))
    lost: list[str] = []
    for host in order:
        answer = ssh_each([(host, command)], shared=True)[host.name]
        if answer.ok:
            return host, answer.stdout
        if not connection_lost(host, answer.rc):
            raise PycliError(f"{'; '.join([*lost, ''])}on {host.name}: {answer.why()}")
        lost.append(f"{host.name} does not answer")
    raise PycliError("; ".join(lost) or "no node to ask")


def node_states(cluster: Cluster) -> dict[str, slurm_nodes.NodeState]:
    """Slurm's view of every node (ask_slurm)."""
    try:
        return slurm_nodes.parse_sinfo_nodes(ask_slurm(cluster, slurm_nodes.SINFO_NODES_COMMAND)[1])
    except PycliError as exc:
        raise PycliError(f"asking Slurm for its nodes failed: {exc}") from None


def unavailable_lines(cluster: Cluster) -> list[str]:
    """What Slurm says of the nodes it will start no job on, a line each, for `pycli check`; a
    line saying why when Slurm cannot be asked (not provisioned yet, slurmctld down)."""
    try:
        states = node_states(cluster)
    except PycliError as exc:
        return [f"Slurm: cannot tell its node states ({exc})"]
    return [f"Slurm: {node.node} {node.state} ({node.reason})"
            for node in slurm_nodes.unavailable(states, [host.name for host in cluster.hosts])]


def set_drained(cluster: Cluster, reasons: dict[str, str], say: Callable[[str], None],
                said: str = "running jobs finish; no new job starts there", keep_slurms: bool = False) -> None:
    """Slurm's DRAIN, with each node's reason, set through a node that answers (ask_slurm); a failure is said, not raised
    (pycli's own list is changed already and every pycli command honours it). `keep_slurms`: a
    node Slurm has drained already keeps Slurm's reason (an administrator's, the health check's)."""
    if not cluster.has_slurm or not reasons:
        return
    if keep_slurms:
        try:
            states = node_states(cluster)
        except PycliError:
            states = {}
        kept = {node: states[node].reason for node in reasons if node in states and "drain" in states[node].state}
        for node, reason in kept.items():
            say(f"Slurm: {node} is drained already; its reason kept: {slurm_nodes.printable(reason)}")
        reasons = {node: reason for node, reason in reasons.items() if node not in kept}
        if not reasons:
            return
    by_reason: dict[str, list[str]] = {}
    for node, reason in reasons.items():
        by_reason.setdefault(reason, []).append(node)
    command = " && ".join(slurm_nodes.drain_command(nodes, reason) for reason, nodes in by_reason.items())
    try:
        ask_slurm(cluster, command)
    except PycliError as exc:
        say(f"pycli: Slurm did not drain {', '.join(reasons)} ({exc}); run '{command}' on {cluster.slurm_controller}")
    else:
        say(f"Slurm: {', '.join(reasons)} DRAIN ({said})")


# The reasons pycli's node gate gives Slurm (pycli_node.node_gate: health check, prolog, epilog).
NODE_GATE_REASONS = ("pycli health: ", "pycli prolog: ", "pycli epilog: ")


def set_resumed(cluster: Cluster, nodes: list[str], say: Callable[[str], None], ours: Mapping[str, str] | None = None,
                force: bool = False) -> list[str]:
    """Slurm's RESUME for those of `nodes` Slurm has drained for one of pycli's reasons (`ours`:
    pycli's drained list's, by node; or its node gate's), set through a node that answers, each with the
    reason it had; with `force`, whatever the reason. Returns the nodes left drained because
    their reason is someone else's (an administrator's "do not resume"); a failure is said, not raised."""
    if not cluster.has_slurm or not nodes:
        return []
    try:
        states = node_states(cluster)
    except PycliError as exc:
        say(f"pycli: cannot tell Slurm's state of {', '.join(nodes)} ({exc}); "
            f"run '{slurm_nodes.resume_command(nodes)}' on {cluster.slurm_controller}")
        return []
    drained = {node: states[node].reason for node in nodes if node in states and "drain" in states[node].state}
    theirs = [node for node, reason in drained.items()
              if not force and reason != (ours or {}).get(node) and not reason.startswith(NODE_GATE_REASONS)]
    for node in theirs:
        say(f"pycli: {node} stays drained in Slurm: its reason is not pycli's ({slurm_nodes.printable(drained[node])}); "
            f"'pycli undrain {node} --force' resumes it")
    resumed = [node for node in drained if node not in theirs]
    if not resumed:
        return theirs
    try:
        ask_slurm(cluster, slurm_nodes.resume_command(resumed))
    except PycliError as exc:
        say(f"pycli: Slurm did not resume {', '.join(resumed)} ({exc}); run "
            f"'{slurm_nodes.resume_command(resumed)}' on {cluster.slurm_controller}")
    else:
        was = "; ".join(f"{node}: {slurm_nodes.printable(drained[node])}" for node in resumed)
        say(f"Slurm: {', '.join(resumed)} RESUME (jobs start there again; drained for {was})")
    return theirs
