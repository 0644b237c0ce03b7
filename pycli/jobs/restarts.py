"""`pycli train --max-restarts N [--min-np M]`: how a failed job goes on.

After a failure pycli asks every host of the job at once, over SSH (a local host answers
without it: pycli.cluster.nodes.node_argv), whether it still answers and which epoch its copy of the
checkpoint holds (the first rank of every node writes one, workloads/wl_loop.py). The job
starts again on the hosts that answered, as many ranks as their slots allow up to the job's
--np and not fewer than --min-np, from the checkpoint on the node that is rank 0 now:
nothing goes through the controller. Rank 0 reads it and sends it to every rank (the built-in
workloads, wl_loop.rank0_start, as torchrun's elastic starts do), so a failure during a save
that left the nodes' copies at different epochs does not split the ranks; the restart's line
names the copies that differ.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from pycli.cluster.hostfiles import fill_hosts
from pycli.cluster.model import Host
from pycli.cluster.nodes import ssh_probe
from pycli.jobs.launch import JobPlan, checkpoint_path

# Prints the epoch a checkpoint holds, or "none" where there is no checkpoint yet.
_EPOCH = "import sys, torch; print(torch.load(sys.argv[1], map_location='cpu', weights_only=True)['epoch'])"


def checkpoint_probe(plan: JobPlan) -> str:
    path = shlex.quote(str(checkpoint_path(plan)))
    return f"if [ -f {path} ]; then {shlex.quote(plan.python)} -c {shlex.quote(_EPOCH)} {path}; else echo none; fi"


@dataclass(frozen=True)
class Restart:
    plan: JobPlan
    epoch: int  # the epoch the checkpoint on the new rank 0 finished; 0: from the start
    lost: tuple[str, ...]  # hosts that did not answer
    answering: tuple[Host, ...]  # every host of the failed attempt that answered (its strays are swept)
    differing: tuple[tuple[str, int], ...] = ()  # (host, epoch; 0: none) where its copy is not rank 0's epoch

    def line(self, number: int, most: int, why: str) -> str:
        rank0 = self.plan.rank0.name
        others = ", ".join(f"{name}'s copy holds {f'epoch {epoch}' if epoch else 'none'}" for name, epoch in self.differing)
        if self.epoch:
            start = f"from epoch {self.epoch + 1} (checkpoint on {rank0}{', sent to every rank: ' + others if others else ''})"
        else:
            again = ("from its --resume checkpoint again" if self.plan.resume is not None
                     else f"from {self.plan.resume_on_node} again" if self.plan.resume_on_node is not None else "from the start")
            because = f"no checkpoint on {rank0}" if self.plan.resume or self.plan.resume_on_node or others else ""
            said = "; ".join(part for part in (because, others) if part)
            start = f"{again}{f' ({said})' if said else ''}"
        gone = f"; {', '.join(self.lost)} left out (no answer)" if self.lost else ""
        return (f"pycli: restart {number} of {most}: {why or 'the job failed'}; going on {start} with "
                f"{self.plan.np} rank(s) on {', '.join(h.name for h in self.plan.hosts)}{gone}")


def _epoch(stdout: str) -> int | None:
    words = stdout.split()
    if words and words[-1] == "none":
        return 0
    return int(words[-1]) if words and words[-1].isdigit() else None


def plan_restart(plan: JobPlan) -> Restart | str:
    """The next attempt of a failed job, or why there is none: up to the request's --np ranks
    on the hosts that answer, and not fewer than its --min-np (all of --np without one)."""
    wanted_np = plan.request.placement.np
    min_np = plan.request.recovery.min_np or wanted_np
    answers = ssh_probe(plan.hosts, checkpoint_probe(plan))
    alive = tuple(h for h in plan.hosts if answers[h.name].ok and _epoch(answers[h.name].stdout) is not None)
    lost = tuple(h.name for h in plan.hosts if h not in alive)
    slots = sum(h.slots for h in plan.hosts if h in alive)
    if not alive or slots < min_np:
        said = "; ".join(f"{name}: {answers[name].why()}" for name in lost)
        return f"{slots} slot(s) answer, fewer than --min-np {min_np} ({said})"
    np = min(wanted_np, slots)
    hosts = fill_hosts(alive, np)
    epochs = {h.name: _epoch(answers[h.name].stdout) or 0 for h in hosts}
    epoch = epochs[hosts[0].name]
    differing = tuple((h.name, epochs[h.name]) for h in hosts if epochs[h.name] != epoch)
    # No checkpoint on the new rank 0 yet: the attempt starts where the failed one started, its
    # --resume checkpoint (staged with the job) or the nodes' checkpoint an earlier restart went on from.
    resume, resume_on_node = (None, checkpoint_path(plan)) if epoch else (plan.resume, plan.resume_on_node)
    elastic_min_np = None if plan.elastic_min_np is None else min(plan.elastic_min_np, np)
    return Restart(replace(plan, hosts=hosts, np=np, resume=resume, resume_on_node=resume_on_node,
                           elastic_min_np=elastic_min_np), epoch, lost, alive, differing)

