"""`pycli check` on a cluster with Slurm: the nodes it measures held in Slurm for its whole run.

The check's gates load the nodes (the allreduce job, the deep gates' compute and link probes),
so on a shared cluster they must never share a node with someone's job, and no job may start
on a node while it is measured. Before the gates run, pycli asks Slurm for the state of every
node and the jobs running on each:

- a node a job runs on (allocated, mixed, completing, draining) is named with its jobs and not
  checked at all;
- the idle ones are held with one exclusive allocation (salloc --no-shell, pycli.jobs.slurm's
  hold_command), released with scancel when the check ends, also on Ctrl-C or a failure; a
  check that dies without releasing them lets them go at the allocation's time limit;
- a node Slurm starts no job on and that runs none (drained, down) is checked without being
  held: nothing can start there meanwhile, and a repaired node shows before it is resumed.

Command lines and parsers: pycli.jobs.slurm (salloc, squeue, scancel) and pycli.jobs.slurm_nodes (sinfo).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import ssh_each
from pycli.core.errors import PycliError
from pycli.jobs import slurm, slurm_nodes
from pycli.jobs.slurm_queue import node_states


@dataclass(frozen=True)
class Hold:
    """What the check does with each node: held, checked unheld, or left alone with its jobs."""

    cluster: Cluster  # the nodes the gates check
    job_id: str = ""  # the allocation holding the idle ones; "" where none is idle
    held: tuple[str, ...] = ()
    unheld: tuple[str, ...] = ()  # no job starts there: drained or down in Slurm
    busy: dict[str, list[str]] = field(default_factory=dict)  # node -> the ids of the jobs on it

    def as_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "held": list(self.held), "unheld": list(self.unheld), "busy": self.busy}


def plan_hold(cluster: Cluster, states: dict[str, slurm_nodes.NodeState], jobs: list[slurm.QueuedJob]) -> Hold:
    """Which nodes the check holds, checks unheld, and leaves to their jobs (pure)."""
    on = slurm.running_jobs_by_node(jobs)
    busy, held, unheld = {}, [], []
    for host in cluster.hosts:
        state = states.get(host.name)
        if state is not None and (state.busy or host.name in on):
            busy[host.name] = on.get(host.name, [])
        elif state is not None and not state.available:
            unheld.append(host.name)
        else:
            held.append(host.name)
    if not held and not unheld:
        raise PycliError("every node runs a Slurm job: nothing to check without measuring beside it ("
                         + "; ".join(_busy_words(busy)) + "); check again once they end, or drain the nodes first")
    checked = cluster
    if busy:  # left out; the launcher (the allreduce job's) the first node left where it is busy
        hosts = tuple(h for h in cluster.hosts if h.name not in busy)
        launcher = cluster.launcher if cluster.launcher not in busy else hosts[0].name
        checked = replace(cluster, hosts=hosts, launcher=launcher)
    return Hold(checked, held=tuple(held), unheld=tuple(unheld), busy=busy)


def _busy_words(busy: dict[str, list[str]]) -> list[str]:
    return [f"{node}: job {', '.join(ids)}" if ids else f"{node}: a job ending" for node, ids in busy.items()]


@contextmanager
def held_for_check(cluster: Cluster, name: str, say: Callable[[str], None]) -> Iterator[Hold]:
    """The check's nodes while it runs: the busy ones left out and said, the idle ones held by an
    exclusive allocation named `name` (unique to the run) until the block ends."""
    host = cluster.launcher_host
    answer = ssh_each([(host, slurm.squeue_command())], shared=True)[host.name]
    if not answer.ok:
        raise PycliError(f"asking Slurm for its jobs on {host.name} failed: {answer.why()}")
    hold = plan_hold(cluster, node_states(cluster), slurm.parse_squeue(answer.stdout))
    if hold.busy:
        say("pycli: Slurm: not checked, a job runs there: " + "; ".join(_busy_words(hold.busy)))
    if hold.unheld:
        say(f"pycli: Slurm: {', '.join(hold.unheld)} checked without holding (Slurm starts no job there)")
    if not hold.held:
        yield hold
        return
    command = slurm.hold_command(hold.held, name)
    try:
        answer = ssh_each([(host, command)], slurm.HOLD_GRANT_S + 60, shared=True)[host.name]
    except BaseException:  # Ctrl-C while salloc waits: the allocation may be granted, its id unread
        _release(host, slurm.cancel_by_name_command(name), say)
        raise
    job_id = slurm.parse_granted(answer.stdout + answer.stderr)
    if not answer.ok or job_id is None:
        _release(host, slurm.cancel_by_name_command(name), say)
        raise PycliError(f"Slurm did not give the check {', '.join(hold.held)} within {slurm.HOLD_GRANT_S} s "
                         f"(salloc on {host.name}: {answer.why()}); a job may have started there meanwhile: check again")
    say(f"pycli: Slurm: {', '.join(hold.held)} held for this check (job {job_id}, exclusive; released when it ends)")
    try:
        yield replace(hold, job_id=job_id)
    finally:
        _release(host, slurm.cancel_command(job_id), say)


def _release(host: Host, command: str, say: Callable[[str], None]) -> None:
    answer = ssh_each([(host, command)], shared=True)[host.name]
    if not answer.ok:
        say(f"pycli: Slurm: releasing the check's nodes failed ({answer.why()}); run '{command}' on {host.name}")
