"""`pycli bench`'s plan: the request, the matrix of cells, what is skipped and why, each cell's job.

A cell is one launcher (horovodrun, mpirun, torchrun) with one collective backend (MPI,
Gloo, NCCL) on one placement (servers x processes per server). Everything here is pure: the
request is checked before any node is touched, and each run becomes a `JobRequest` on a
cluster changed in memory for its placement.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pycli.cluster.model import INTERFACE_VAR, Cluster
from pycli.cluster.node_facts import NodeFacts
from pycli.core.errors import BadInput
from pycli.core.sizes import parse_size
from pycli.jobs.launch import ALLREDUCE_SCRIPT, LAUNCHERS
from pycli.jobs.request import JobRequest

BENCH_BACKENDS = ("mpi", "gloo", "nccl")
BENCH_WORKLOADS = ("synthetic", "mnist")
DEFAULT_ALLREDUCE_SIZES = "4K:256M"

WITHIN = "within one server"
ACROSS = "across servers"


@dataclass(frozen=True)
class BenchRequest:
    backends: tuple[str, ...] = BENCH_BACKENDS
    process_counts: tuple[int, ...] = (1, 2, 4)  # --np-list
    launchers: tuple[str, ...] = ("horovod",)
    workload: str = "synthetic"
    repeat: int = 3
    workload_args: tuple[str, ...] = ()
    allreduce_sizes: str | None = DEFAULT_ALLREDUCE_SIZES  # None: no microbenchmark
    allreduce_iters: int = 5
    iperf_seconds: int = 5
    env: tuple[str, ...] = ()  # --env NAME=VALUE for every rank of every run (pycli train --env)


def parse_choices(text: str, choices: Sequence[str], option: str) -> tuple[str, ...]:
    """'mpi,gloo' as ('mpi', 'gloo'), in the order given; unknown or no names are BadInput."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise BadInput(f"{option} {text!r} names nothing; use one or more of {', '.join(choices)}, comma-separated")
    unknown = [name for name in names if name not in choices]
    if unknown:
        raise BadInput(f"unknown {option} {', '.join(map(repr, unknown))}; use one or more of {', '.join(choices)}")
    return tuple(dict.fromkeys(names))


def parse_process_counts(text: str) -> tuple[int, ...]:
    """'1,2,4' as (1, 2, 4), sorted; each a positive whole number."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise BadInput(f"--np-list {text!r} names no process count; give e.g. --np-list 1,2,4")
    bad = [part for part in parts if not part.isdigit() or int(part) < 1]
    if bad:
        raise BadInput(f"--np-list {text!r}: {', '.join(bad)} is not a positive whole number of processes")
    return tuple(sorted({int(part) for part in parts}))


def parse_size_range(text: str) -> tuple[int, ...]:
    """'4K:256M' (doubling from the first to the last) or '4K,1M': the sizes it names."""
    if ":" in text:
        low_text, high_text = text.split(":", 1)
        low, high = parse_size(low_text, "--allreduce-sizes"), parse_size(high_text, "--allreduce-sizes")
        if high < low:
            raise BadInput(f"--allreduce-sizes {text!r}: the first size must not exceed the last")
        return tuple(low * 2**i for i in range(int(math.log2(high // low)) + 1) if low * 2**i <= high)
    sizes = tuple(parse_size(part, "--allreduce-sizes") for part in text.split(",") if part.strip())
    if not sizes:
        raise BadInput(f"--allreduce-sizes {text!r} names no size; give e.g. 4K:256M")
    return sizes


def bench_request(
    *, backends: str, process_counts: str, launchers: str, workload: str, repeat: int,
    workload_args: Sequence[str] = (), allreduce_sizes: str | None = DEFAULT_ALLREDUCE_SIZES,
    allreduce_iters: int = 5, iperf_seconds: int = 5, env: Sequence[str] = (),
) -> BenchRequest:
    """The command line, checked before any node is touched (BadInput, exit 2)."""
    if workload not in BENCH_WORKLOADS:
        raise BadInput(f"unknown --workload {workload!r}; use one of {', '.join(BENCH_WORKLOADS)}")
    if repeat < 1:
        raise BadInput(f"--repeat {repeat}: each combination runs at least once")
    if allreduce_iters < 2:
        raise BadInput(f"--allreduce-iters {allreduce_iters}: at least 2 timed iterations (for a spread)")
    if iperf_seconds < 1:
        raise BadInput(f"--iperf-seconds {iperf_seconds}: at least 1 second")
    if allreduce_sizes is not None:
        parse_size_range(allreduce_sizes)
    return BenchRequest(
        backends=parse_choices(backends, BENCH_BACKENDS, "--backends"),
        process_counts=parse_process_counts(process_counts),
        launchers=parse_choices(launchers, LAUNCHERS, "--launchers"),
        workload=workload, repeat=repeat, workload_args=tuple(workload_args),
        allreduce_sizes=allreduce_sizes, allreduce_iters=allreduce_iters, iperf_seconds=iperf_seconds,
        env=tuple(env),
    )


@dataclass(frozen=True)
class Placement:
    servers: int
    per_server: int

    @property
    def processes(self) -> int:
        return self.servers * self.per_server

    @property
    def scope(self) -> str:
        return WITHIN if self.servers == 1 else ACROSS

    def __str__(self) -> str:
        return f"{self.servers}x{self.per_server}"


@dataclass(frozen=True)
class Cell:
    """One combination: a launcher, a backend and where the processes run."""

    launcher: str
    backend: str
    placement: Placement

    @property
    def key(self) -> str:
        return f"{self.launcher}-{self.backend}-{self.placement}"

    @property
    def device(self) -> str:
        # NCCL moves GPU memory; MPI and Gloo cells keep tensors on the CPU, so their bytes
        # really travel over MPI or Gloo (with GPU tensors Horovod would use NCCL anyway).
        return "cuda" if self.backend == "nccl" else "cpu"

    def describe(self) -> str:
        p = self.placement
        return (f"{self.backend} via {self.launcher}, {p.servers} server{'s' if p.servers > 1 else ''} "
                f"x {p.per_server} process{'es' if p.per_server > 1 else ''}")


@dataclass(frozen=True)
class Skipped:
    cell: Cell
    reason: str


@dataclass(frozen=True)
class NodeCapacity:
    """What the matrix needs to know about one server."""

    name: str
    cpus: int
    gpus: int
    torch: str = ""
    horovod: str = ""
    horovod_controllers: frozenset[str] = frozenset()
    horovod_operations: frozenset[str] = frozenset()


def node_capacity(facts: NodeFacts) -> NodeCapacity:
    build = facts.horovod_build
    return NodeCapacity(
        name=facts.host, cpus=facts.cpus, gpus=facts.gpu_count, torch=facts.torch, horovod=facts.horovod,
        horovod_controllers=build.controllers if build else frozenset(),
        horovod_operations=build.operations if build else frozenset(),
    )


def placements(process_counts: Iterable[int]) -> list[Placement]:
    """Every servers x processes-per-server split of each count, one server first."""
    found = []
    for count in sorted(set(process_counts) | {1}):  # speed-up needs the 1-process run
        found += [Placement(count // per, per) for per in range(count, 0, -1) if count % per == 0]
    return found


def skip_reason(cell: Cell, nodes: Sequence[NodeCapacity], workload: str | None) -> str | None:
    """Why the cluster cannot run this cell, or None. `workload` None: the allreduce microbenchmark."""
    launcher, backend, place = cell.launcher, cell.backend, cell.placement
    if launcher == "torchrun" and backend == "mpi":
        return "torch.distributed from PyPI is built without MPI; MPI is measured through Horovod (--launchers horovod)"
    if launcher == "mpirun" and backend == "gloo":
        return "mpirun runs Horovod with its MPI controller; Gloo is measured with --launchers horovod or torchrun"
    if place.servers > len(nodes):
        return f"needs {place.servers} servers; the inventory has {len(nodes)}"
    used = nodes[: place.servers]
    if backend == "nccl":
        short = [n for n in used if n.gpus < place.per_server]
        if short:
            have = ", ".join(f"{n.name} has {n.gpus or 'no'} GPU{'s' if n.gpus != 1 else ''}" for n in short)
            return f"NCCL needs a GPU per process ({place.per_server} per server): {have}"
    else:
        short = [n for n in used if n.cpus < place.per_server]
        if short:
            have = ", ".join(f"{n.name} has {n.cpus} CPU core{'s' if n.cpus != 1 else ''}" for n in short)
            return f"{place.per_server} CPU processes per server would oversubscribe it: {have}"
    missing = "torch" if launcher == "torchrun" else "horovod"
    lacking = [n.name for n in used if not getattr(n, missing)]
    if lacking:
        return f"{'torch' if missing == 'torch' else 'Horovod'} is not installed on {', '.join(lacking)}; run 'pycli provision'"
    if launcher in ("horovod", "mpirun"):
        controller = "mpi" if launcher == "mpirun" or backend == "mpi" else "gloo"
        without = [n.name for n in used if controller not in n.horovod_controllers]
        if without:
            name = controller.upper() if controller == "mpi" else "Gloo"
            return f"Horovod on {', '.join(without)} was built without the {name} controller"
        if backend == "nccl":
            without = [n.name for n in used if "nccl" not in n.horovod_operations]
            if without:
                return f"Horovod on {', '.join(without)} was built without NCCL"
    if workload == "synthetic" and launcher == "torchrun" and backend == "gloo" and any(n.gpus for n in used):
        return "synthetic.py under torchrun picks NCCL whenever a GPU is present; measure Gloo with --workload mnist"
    return None


def plan_matrix(request: BenchRequest, nodes: Sequence[NodeCapacity]) -> tuple[list[Cell], list[Skipped]]:
    """The cells to run, in running order (each 1-process baseline first), and those skipped."""
    cells, skipped = [], []
    for launcher in request.launchers:
        for backend in request.backends:
            for place in placements(request.process_counts):
                cell = Cell(launcher, backend, place)
                reason = skip_reason(cell, nodes, request.workload)
                if reason is None:
                    cells.append(cell)
                else:
                    skipped.append(Skipped(cell, reason))
    return cells, skipped


def allreduce_placement(nodes: Sequence[NodeCapacity]) -> Placement:
    """Every server with one process (the network's view); two processes on a lone server."""
    return Placement(len(nodes), 1) if len(nodes) > 1 else Placement(1, 2)


def plan_allreduce(request: BenchRequest, nodes: Sequence[NodeCapacity]) -> tuple[list[Cell], list[Skipped]]:
    if request.allreduce_sizes is None:
        return [], []
    place = allreduce_placement(nodes)
    cells, skipped = [], []
    for launcher in request.launchers:
        for backend in request.backends:
            cell = Cell(launcher, backend, place)
            reason = skip_reason(cell, nodes, None)
            if reason is None:
                cells.append(cell)
            else:
                skipped.append(Skipped(cell, reason))
    return cells, skipped


def horovodrun_controller(cell: Cell) -> str:
    """horovodrun's controller for a cell (NCCL data moves under the Gloo controller)."""
    return "mpi" if cell.backend == "mpi" or cell.launcher == "mpirun" else "gloo"


def training_job(cell: Cell, workload: str, workload_args: Sequence[str], env: Sequence[str] = ()) -> JobRequest:
    """The job of one run of a training cell."""
    args: list[str] = []
    if cell.device == "cpu":
        args.append("--cpu")
    name = workload
    if workload == "mnist" and cell.launcher == "torchrun":
        name = "ddp"  # the same training under DistributedDataParallel
        args += ["--backend", cell.backend]
    return JobRequest.of(np=cell.placement.processes, workload=name, launcher=cell.launcher,
                      controller=horovodrun_controller(cell), script_args=(*args, *workload_args), env=tuple(env))


def allreduce_job(cell: Cell, sizes: str, iters: int, env: Sequence[str] = ()) -> JobRequest:
    """The job of one allreduce microbenchmark."""
    args = ["--comm", "torch", "--backend", cell.backend] if cell.launcher == "torchrun" else ["--comm", "horovod"]
    if cell.device == "cpu":
        args.append("--cpu")
    args += ["--sizes", sizes, "--iters", str(iters), "--metrics", "metrics.jsonl"]
    return JobRequest.of(np=cell.placement.processes, workload=str(ALLREDUCE_SCRIPT), launcher=cell.launcher,
                      controller=horovodrun_controller(cell), script_args=tuple(args), env=tuple(env))


def placement_cluster(cluster: Cluster, place: Placement) -> Cluster:
    """`cluster` with every host's `slots` set for `place`; on one server, no network interface.

    Jobs fill hosts in inventory order, so N servers x P processes is np = N·P over hosts of
    P slots each. No NIC carries a one-server job, and horovodrun with --network-interface on
    a single host fails ("No interface is found for address 127.0.0.1"), as it runs that
    host's ranks locally.
    """
    settings = dict(cluster.settings)
    if place.servers == 1:
        settings.pop(INTERFACE_VAR, None)
    hosts = tuple(replace(host, slots=place.per_server) for host in cluster.hosts)
    return replace(cluster, hosts=hosts, settings=settings)


def request_command(inventory: Path, request: BenchRequest) -> str:
    """The command line that makes this bench again (for the report)."""
    argv = ["pycli", "bench", "-i", str(inventory), "--backends", ",".join(request.backends),
            "--np-list", ",".join(map(str, request.process_counts)), "--launchers", ",".join(request.launchers),
            "--workload", request.workload, "--repeat", str(request.repeat)]
    if request.allreduce_sizes is None:
        argv.append("--no-allreduce")
    else:
        argv += ["--allreduce-sizes", request.allreduce_sizes, "--allreduce-iters", str(request.allreduce_iters),
                 "--iperf-seconds", str(request.iperf_seconds)]
    for setting in request.env:
        argv += ["--env", setting]
    if request.workload_args:
        argv += ["--", *request.workload_args]
    return shlex.join(argv)
