"""`pycli check` and `pycli bench` on a cluster with Slurm: the nodes they measure held in Slurm
for their whole run (an allocation of no job's but theirs).

The check's gates load the nodes (the allreduce job, the deep gates' compute and link probes),
so on a shared cluster they must never share a node with someone's job, and no job may start
on a node while it is measured. Before the gates run, pycli asks Slurm for the state of every
node and the jobs running on each:

- a node a job runs on (allocated, mixed, completing, draining) is named with its jobs and not
  checked at all;
- the idle ones are held with one exclusive allocation (salloc --no-shell, pycli.jobs.slurm's
  hold_command) for each partition they need (an allocation is of one partition: nodes in
  different partitions take one each, pycli.cluster.slurm_nodes.by_partition), released with
  scancel when the check ends, also on Ctrl-C or a failure; a check that dies without releasing
  them lets them go at the allocations' time limit;
- a node Slurm starts no job on and that runs none (drained, down), or that Slurm does not know
  (not in its slurm.conf yet), is checked without being held: nothing can start there
  meanwhile, and a repaired node shows before it is resumed;
- where Slurm cannot be asked (slurmctld down, or no node answers for it), every node is checked
  unheld, the check says why, and it fails: the health tool reports most when the cluster is
  least healthy. Slurm is asked on the launcher node, else on the controller or another node.

Command lines and parsers: pycli.jobs.slurm (salloc, squeue, scancel) and pycli.cluster.slurm_nodes (sinfo).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pycli.cluster import slurm_nodes
from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import ssh_each
from pycli.cluster.slurm_state import ask_slurm
from pycli.core.errors import PycliError
from pycli.jobs import slurm


@dataclass(frozen=True)
class Hold:
    """What the check does with each node: held, checked unheld, or left alone with its jobs."""

    cluster: Cluster  # the nodes the gates check
    job_ids: tuple[str, ...] = ()  # the allocations holding the idle ones, one a partition; none where none is idle
    held: tuple[str, ...] = ()
    unheld: tuple[str, ...] = ()  # no job starts there: drained or down in Slurm
    busy: dict[str, list[str]] = field(default_factory=dict)  # node -> the ids of the jobs on it
    unknown: tuple[str, ...] = ()  # checked unheld: Slurm does not know them
    slurm_error: str = ""  # why Slurm could not be asked: every node checked unheld, and the check fails

    def as_json(self) -> dict[str, object]:
        return {"job_id": ",".join(self.job_ids), "held": list(self.held), "unheld": list(self.unheld), "busy": self.busy,
                "unknown": list(self.unknown), "slurm_error": self.slurm_error}


def plan_hold(cluster: Cluster, states: dict[str, slurm_nodes.NodeState], jobs: list[slurm.QueuedJob]) -> Hold:
    """Which nodes the check holds, checks unheld, and leaves to their jobs (pure)."""
    on = slurm.running_jobs_by_node(jobs)
    busy, held, unheld, unknown = {}, [], [], []
    for host in cluster.hosts:
        state = states.get(host.name)
        if host.name in on or (state is not None and state.busy):
            busy[host.name] = on.get(host.name, [])
        elif state is None:
            unknown.append(host.name)
        elif not state.available:
            unheld.append(host.name)
        else:
            held.append(host.name)
    if not held and not unheld and not unknown:
        raise PycliError("every node runs a Slurm job: nothing to check without measuring beside it ("
                         + "; ".join(_busy_words(busy)) + "); check again once they end, or drain the nodes first")
    checked = cluster
    if busy:  # left out; the launcher (the allreduce job's) the first node left where it is busy
        hosts = tuple(h for h in cluster.hosts if h.name not in busy)
        launcher = cluster.launcher if cluster.launcher not in busy else hosts[0].name
        checked = replace(cluster, hosts=hosts, launcher=launcher)
    return Hold(checked, held=tuple(held), unheld=tuple(unheld + unknown), busy=busy, unknown=tuple(unknown))


def _busy_words(busy: dict[str, list[str]]) -> list[str]:
    return [f"{node}: job {', '.join(ids)}" if ids else f"{node}: a job ending" for node, ids in busy.items()]


# Between the two answers of one SSH command.
_SPLIT = "@@pycli-sinfo"


@contextmanager
def held_for_check(cluster: Cluster, name: str, say: Callable[[str], None], what: str = "check") -> Iterator[Hold]:
    """The nodes `what` measures (pycli check, pycli bench) while it runs: the busy ones left out
    and said, the idle ones held by an exclusive allocation named `name` (unique to the run)
    until the block ends."""
    try:
        host, said = ask_slurm(cluster, f"{slurm.squeue_command()} && echo {_SPLIT} && {slurm_nodes.SINFO_NODES_COMMAND} "
                                        f"&& echo {_SPLIT} && {slurm_nodes.SINFO_PARTITIONS_COMMAND}")
    except PycliError as error:
        say(f"pycli: Slurm cannot be asked ({error}): every node measured without holding it, a job may run beside "
            f"the {what}" + (", and the check fails" if what == "check" else ""))
        yield Hold(cluster, unheld=tuple(h.name for h in cluster.hosts), slurm_error=str(error))
        return
    queue, _, rest = said.partition(_SPLIT)
    nodes, _, partitions = rest.partition(_SPLIT)
    hold = plan_hold(cluster, slurm_nodes.parse_sinfo_nodes(nodes), slurm.parse_squeue(queue))
    if hold.unknown:
        say(f"pycli: Slurm: {', '.join(hold.unknown)} checked without holding (not in Slurm's slurm.conf: "
            "'pycli provision --tags slurm' adds it)")
    if hold.busy:
        say(f"pycli: Slurm: not {'checked' if what == 'check' else 'measured'}, a job runs there: "
            + "; ".join(_busy_words(hold.busy)))
    if stopped := [node for node in hold.unheld if node not in hold.unknown]:
        say(f"pycli: Slurm: {', '.join(stopped)} checked without holding (Slurm starts no job there)")
    if not hold.held:
        yield hold
        return
    job_ids: list[str] = []
    for partition, group in slurm_nodes.by_partition(hold.held, slurm_nodes.parse_node_partitions(partitions)):
        command = slurm.hold_command(group, name, what=what, partition=partition)  # asked where Slurm answered
        try:
            answer = ssh_each([(host, command)], slurm.HOLD_GRANT_S + 60, shared=True)[host.name]
        except BaseException:  # Ctrl-C while salloc waits: the allocation may be granted, its id unread
            _release(host, slurm.cancel_by_name_command(name), say)
            raise
        job_id = slurm.parse_granted(answer.stdout + answer.stderr)
        if not answer.ok or job_id is None:
            _release(host, slurm.cancel_by_name_command(name), say)  # this one and those granted before it
            raise PycliError(f"Slurm did not give the {what} {', '.join(group)} within {slurm.HOLD_GRANT_S} s "
                             f"(salloc on {host.name}: {answer.why()}); a job may have started there meanwhile: check again")
        job_ids.append(job_id)
    jobs = f"job {job_ids[0]}" if len(job_ids) == 1 else f"jobs {', '.join(job_ids)}, one a partition"
    say(f"pycli: Slurm: {', '.join(hold.held)} held for this {what} ({jobs}, exclusive; released when it ends)")
    try:
        with _ended_by_hangup():
            yield replace(hold, job_ids=tuple(job_ids))
    finally:
        _release(host, "; ".join(slurm.cancel_command(job_id) for job_id in job_ids), say)


@contextmanager
def _ended_by_hangup() -> Iterator[None]:
    """A closed terminal (SIGHUP) or a plain kill (SIGTERM) ends the block as Ctrl-C would, so the
    hold is released at once rather than at its time limit, an hour on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, end) for signum in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _release(host: Host, command: str, say: Callable[[str], None]) -> None:
    answer = ssh_each([(host, command)], shared=True)[host.name]
    if not answer.ok:
        say(f"pycli: Slurm: releasing the check's nodes failed ({answer.why()}); run '{command}' on {host.name}")
