"""How a job's attempts run: over SSH, pycli starts the ranks on the nodes itself; through Slurm,
each attempt is a batch job of its own. The one seam between the two: pycli.jobs.train.run_job
asks its runner which nodes may run the job, to set up and remove the job's containers, to run
each attempt, and how to follow one it lost sight of, and never asks which runner it has.

- SshRunner: every node of the inventory may run; `--docker` containers are started by the
  playbook playbooks/job_container.yml before the first attempt; an attempt is
  pycli.jobs.processes.run_processes.
- SlurmRunner: the nodes Slurm will start a job on (its health check's drains left out); the
  playbook only prepares each node's container options, and the job's first step starts the
  containers inside its allocation; an attempt is pycli.jobs.slurm_queue.run_slurm, its Slurm
  job id recorded in the run folder's job.txt.

Either way the playbook removes the job's containers (and their keys) when the job ends.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path

from pycli.cluster import runner, slurm_nodes, slurm_state
from pycli.cluster.model import Cluster
from pycli.core.errors import PycliError, Unreachable, warn
from pycli.core.tree import PROJECT_ROOT
from pycli.jobs import containers
from pycli.jobs import slurm_queue as slurm_jobs
from pycli.jobs.launch import JobPlan
from pycli.jobs.processes import JobExit, run_processes
from pycli.jobs.request import JobRequest
from pycli.jobs.slurm import SLURM, choose_scheduler

CONTAINER_PLAYBOOK = PROJECT_ROOT / "playbooks" / "job_container.yml"


class Runner(ABC):
    """Runs the attempts of one job, writing what it says with `write`, its files in `run_dir`."""

    def __init__(self, inventory: Path, run_dir: Path, write: Callable[[str], None]) -> None:
        self.inventory, self.run_dir, self.write = inventory, run_dir, write

    def nodes(self, cluster: Cluster) -> Cluster:
        """The cluster less the nodes that may not run the job."""
        return cluster

    @abstractmethod
    def containers_up(self, plan: JobPlan) -> str:
        """--docker: what the job's containers need before its first attempt; the line that says so."""

    def containers_down(self, plan: JobPlan) -> None:
        """--docker: no container of the job is left on any node (and with it, none of its ranks),
        nor the job's container files with its private keys."""
        assert plan.request.container is not None
        request = runner.RunRequest(
            inventory=self.inventory, playbook=CONTAINER_PLAYBOOK, limit=",".join(h.name for h in plan.hosts),
            extravars=containers.playbook_vars(plan.request.container, plan.job_id, plan.job_dir, plan.layout.work_dir,
                                               "absent"),
        )
        result = runner.run(request, self.run_dir / "containers-removed")
        if result.status != "successful":
            hosts = sorted(set(result.unreachable) | {h for h, r in result.hosts.items() if r.failed})
            warn(f"the job's containers or keys may be left on {', '.join(hosts) or 'its nodes'}: "
                 f"removing them failed; see {self.run_dir / 'containers-removed'}")

    @abstractmethod
    def attempt(self, plan: JobPlan, time_limit_s: float | None, number: int) -> JobExit:
        """One attempt of the job (`number`: 0, then each restart's)."""

    def follow_line(self) -> str:
        """How to follow the newest attempt, where it ended detached (pycli lost sight of it)."""
        raise PycliError("a job started over SSH is never detached")

    def _containers_playbook(self, plan: JobPlan, state: str, what: str) -> None:
        assert plan.request.container is not None
        _run_playbook(
            self.inventory, CONTAINER_PLAYBOOK, self.run_dir / "containers",
            containers.playbook_vars(plan.request.container, plan.job_id, plan.job_dir, plan.layout.work_dir, state),
            ",".join(h.name for h in plan.hosts), f"{what} the job containers of {plan.request.container.image}",
        )


class SshRunner(Runner):
    """pycli starts the ranks over SSH; the job's containers run before its first attempt."""

    def containers_up(self, plan: JobPlan) -> str:
        assert plan.request.container is not None
        up = time.monotonic()
        self._containers_playbook(plan, "started", "starting")
        return (f"pycli: job containers up on {', '.join(h.name for h in plan.hosts)} "
                f"(sshd on port {plan.request.container.port(slurm=False)}) in {time.monotonic() - up:.0f} s")

    def attempt(self, plan: JobPlan, time_limit_s: float | None, number: int) -> JobExit:
        return run_processes(plan, self.write, time_limit_s)


class SlurmRunner(Runner):
    """Each attempt a Slurm job of its own, waiting its turn in the queue."""

    def __init__(self, inventory: Path, run_dir: Path, write: Callable[[str], None]) -> None:
        super().__init__(inventory, run_dir, write)
        self.states: dict[str, slurm_nodes.NodeState] = {}
        self.slurm_ids: list[str] = []

    def nodes(self, cluster: Cluster) -> Cluster:
        """Those Slurm will start a job on: the ones its health check drained, or down, left out and said."""
        self.states = slurm_state.node_states(cluster)
        return slurm_jobs.without_unavailable(cluster, self.states, self.write)

    def containers_up(self, plan: JobPlan) -> str:
        self._containers_playbook(plan, "prepared", "preparing")
        return ("pycli: the job's containers start as its first step, inside its allocation; Slurm's epilog removes "
                "them as the job ends")

    def attempt(self, plan: JobPlan, time_limit_s: float | None, number: int) -> JobExit:
        ended, slurm_id = slurm_jobs.run_slurm(plan, self.states, self.run_dir, self.write, time_limit_s, number)
        self.slurm_ids.append(slurm_id)
        with (self.run_dir / "job.txt").open("a") as record:
            record.write(f"slurm job {slurm_id}\n")
        return ended

    def follow_line(self) -> str:
        return f"follow it with 'pycli jobs {self.inventory} --attach {self.slurm_ids[-1]}'"


def runner_for(cluster: Cluster, request: JobRequest, run_dir: Path, write: Callable[[str], None]) -> Runner:
    """The runner of `request` on `cluster`: through Slurm where the job goes through its queue
    (pycli.jobs.slurm.choose_scheduler, as the plan decides it), else over SSH."""
    kind = SlurmRunner if choose_scheduler(request.queue.scheduler, cluster.has_slurm) == SLURM else SshRunner
    return kind(cluster.inventory_path, run_dir, write)


def _run_playbook(inventory: Path, playbook: Path, run_dir: Path, extravars: Mapping[str, object], limit: str,
                  what: str) -> None:
    request = runner.RunRequest(inventory=inventory, playbook=playbook, extravars=extravars, limit=limit)
    result = runner.run(request, run_dir)
    if result.unreachable:
        raise Unreachable(f"{what}: cannot reach {', '.join(result.unreachable)}; see {run_dir}")
    if result.status != "successful":
        by_message: dict[str, list[str]] = {}  # the same failure on many hosts is said once
        for host, host_result in result.hosts.items():
            if host_result.failed:
                by_message.setdefault(" ".join(host_result.messages), []).append(host)
        detail = "; ".join(f"{', '.join(hosts)}: {message}" for message, hosts in by_message.items())
        raise PycliError(f"{what} failed: {detail or result.status}; see {run_dir}")
