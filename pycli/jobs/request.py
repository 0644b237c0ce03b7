"""The request of one job, as its caller builds it (`pycli train`, the allreduce gate of `pycli
check`, each run of `pycli bench`) and hands it down whole: pycli.jobs.train plans it, the plan
(pycli.jobs.launch.JobPlan) carries it beside what planning decided. Its own module, so the
plan can hold it without launch_lines importing train."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pycli.jobs.containers import JobContainer

# horovodrun's controller when nobody names one (`pycli train`, the allreduce gate of `pycli check`).
DEFAULT_CONTROLLER = "gloo"


@dataclass(frozen=True)
class JobRequest:
    """One job as a caller asks for it: `pycli train`, the allreduce gate of `pycli check`, each run of `pycli bench`.

    Pure data, frozen; pycli.jobs.train.plan_job checks it against the cluster before anything runs.
    """

    np: int
    workload: str = "mnist"  # a built-in workload (pycli.jobs.train.WORKLOADS) or a path to a .py script
    launcher: str | None = None  # None: the workload's usual launcher
    controller: str = DEFAULT_CONTROLLER  # horovodrun's controller: gloo or mpi
    script_args: tuple[str, ...] = ()
    network_interface: str | None = None  # None: the inventory's pycli_network_interface
    data_dir: Path | None = None  # on the controller; None: the built-in digits where the workload reads data
    resume: Path | None = None  # a checkpoint on the controller to continue from
    container: JobContainer | None = None  # every rank inside the job's containers (--docker)
    time_limit_s: float | None = None  # --time-limit: stop the job on every node after this long
    max_restarts: int = 0  # --max-restarts: pycli starts a failed job again this often (pycli/jobs/restarts.py)
    elastic_restarts: int | None = None  # --elastic-restarts: torchrun's agents' restarts under --elastic; None: 3
    min_np: int | None = None  # --min-np: a restart or an elastic job may go on with this few ranks; None: all --np
    elastic: bool = False  # --elastic: the launcher's elastic mode (horovodrun or torchrun) goes on when ranks are lost
    threads_per_rank: int | None = None  # --threads-per-rank; None: each node's cores shared out between its ranks
    env: tuple[str, ...] = ()  # --env NAME=VALUE for every rank
    autotune: bool = False  # --autotune: horovodrun's autotuning, its log fetched with the results
    # --scheduler: "slurm" (through Slurm's queue), "ssh" (started over SSH), None: Slurm where the
    # inventory has it (pycli.jobs.slurm.choose_scheduler). The gates of `pycli check` and `pycli bench`
    # measure the nodes themselves and start their jobs over SSH.
    scheduler: str | None = "ssh"
    # --gpus-per-node: the GPUs the job gets on each of its nodes (through Slurm its --gres; over
    # SSH the first N, as CUDA_VISIBLE_DEVICES); None: one per rank on nodes that have GPUs.
    gpus_per_node: int | None = None
    # --account, --qos, --partition: Slurm's, passed to sbatch as given (pycli.jobs.slurm.queue_options).
    account: str | None = None
    qos: str | None = None
    partition: str | None = None

    @property
    def queue(self) -> dict[str, str | None]:
        """The flags only Slurm has, by name (pycli.jobs.slurm.QUEUE_FLAGS)."""
        return {"account": self.account, "qos": self.qos, "partition": self.partition}
