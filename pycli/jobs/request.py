"""The request of one job, as its caller builds it (`pycli train`, the allreduce gate of `pycli
check`, each run of `pycli bench`) and hands it down: pycli.jobs.train plans it, the plan
(pycli.jobs.launch.JobPlan) carries it beside what planning decided. Its own module, so the
plan can hold it without launch_lines importing train.

It comes in parts, each read by the modules it concerns: what runs (launch), where and on
how much (placement), how it waits its turn and for how long (queue), what happens when it
fails (recovery), the containers it runs in, and the files it starts from (data).
`JobRequest.of(np=..., workload=...)` builds one from the command line's flat names (FIELDS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pycli.jobs.containers import JobContainer

# horovodrun's controller when nobody names one (`pycli train`, the allreduce gate of `pycli check`).
DEFAULT_CONTROLLER = "gloo"


@dataclass(frozen=True)
class Launch:
    """What runs, and how it is started."""

    workload: str = "mnist"  # a built-in workload (pycli.jobs.train.WORKLOADS) or a path to a .py script
    launcher: str | None = None  # None: the workload's usual launcher
    controller: str = DEFAULT_CONTROLLER  # horovodrun's controller: gloo or mpi
    script_args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # --env NAME=VALUE for every rank
    threads_per_rank: int | None = None  # --threads-per-rank; None: each node's cores shared out between its ranks
    autotune: bool = False  # --autotune: horovodrun's autotuning, its log fetched with the results


@dataclass(frozen=True)
class Placement:
    """How many ranks, and what each node gives them."""

    np: int = 1
    # --gpus-per-node: the GPUs the job gets on each of its nodes (through Slurm its --gres; over
    # SSH the first N, as CUDA_VISIBLE_DEVICES); None: one per rank on nodes that have GPUs.
    gpus_per_node: int | None = None
    network_interface: str | None = None  # None: the inventory's pycli_network_interface


@dataclass(frozen=True)
class Queue:
    """How the job waits its turn, and how long it may run."""

    # --scheduler: "slurm" (through Slurm's queue), "ssh" (started over SSH), None: Slurm where the
    # inventory has it (pycli.jobs.slurm.choose_scheduler). The gates of `pycli check` and `pycli bench`
    # measure the nodes themselves and start their jobs over SSH.
    scheduler: str | None = "ssh"
    # --account, --qos, --partition: Slurm's, passed to sbatch as given (pycli.jobs.slurm.queue_options).
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    time_limit_s: float | None = None  # --time-limit: stop the job on every node after this long (Slurm's --time)

    @property
    def flags(self) -> dict[str, str | None]:
        """The flags only Slurm has, by name (pycli.jobs.slurm.QUEUE_FLAGS)."""
        return {"account": self.account, "qos": self.qos, "partition": self.partition}


@dataclass(frozen=True)
class Recovery:
    """What happens when ranks fail: pycli's restarts, or the launcher's elastic mode."""

    max_restarts: int = 0  # --max-restarts: pycli starts a failed job again this often (pycli/jobs/restarts.py)
    elastic_restarts: int | None = None  # --elastic-restarts: torchrun's agents' restarts under --elastic; None: 3
    min_np: int | None = None  # --min-np: a restart or an elastic job may go on with this few ranks; None: all --np
    elastic: bool = False  # --elastic: the launcher's elastic mode (horovodrun or torchrun) goes on when ranks are lost


@dataclass(frozen=True)
class Data:
    """What the job starts from, on the controller."""

    data_dir: Path | None = None  # None: the built-in digits where the workload reads data
    resume: Path | None = None  # a checkpoint to continue from


@dataclass(frozen=True)
class JobRequest:
    """One job as a caller asks for it: `pycli train`, the allreduce gate of `pycli check`, each run of `pycli bench`.

    Pure data, frozen; pycli.jobs.train.plan_job checks it against the cluster before anything runs.
    """

    placement: Placement
    launch: Launch = field(default_factory=Launch)
    queue: Queue = field(default_factory=Queue)
    recovery: Recovery = field(default_factory=Recovery)
    container: JobContainer | None = None  # every rank inside the job's containers (--docker)
    data: Data = field(default_factory=Data)

    @classmethod
    def of(cls, np: int, container: JobContainer | None = None, **flat: Any) -> JobRequest:
        """A request from the command line's names (FIELDS: `workload=`, `max_restarts=`, ...)."""
        parts: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            if name not in FIELDS:
                raise TypeError(f"JobRequest has no field {name!r}")
            parts.setdefault(FIELDS[name], {})[name] = value
        return cls(placement=Placement(np=np, **parts.pop("placement", {})), container=container,
                   **{part: PARTS[part](**values) for part, values in parts.items()})

    def with_(self, **flat: Any) -> JobRequest:
        """This request with the named fields (FIELDS' names) changed."""
        changed: dict[str, Any] = {}
        for name, value in flat.items():
            if name == "container":
                changed["container"] = value
                continue
            part = FIELDS[name]
            changed[part] = replace(changed.get(part, getattr(self, part)), **{name: value})
        return replace(self, **changed)


PARTS: dict[str, type] = {"launch": Launch, "placement": Placement, "queue": Queue, "recovery": Recovery, "data": Data}
# Each field by its command line name, and the part that holds it.
FIELDS: dict[str, str] = {each.name: part for part, kind in PARTS.items() for each in fields(kind)}
