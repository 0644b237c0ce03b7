"""`pycli bench`: the backend x scale matrix of seed 003, and seed 004's launcher comparison.

The same training workload runs over each communication backend (MPI, Gloo, NCCL) under
each launcher (horovodrun, mpirun, torchrun) on 1..N processes, both within one server and
across servers, `--repeat` times; each run is one `pycli.train.train()` job with its own
run folder. From the runs come the mean step time and throughput with their 95 % spread,
the speed-up over the 1-process run of the same launcher and backend, and the scaling
efficiency (speed-up / processes). Combinations the cluster cannot run are skipped with the
reason. An allreduce microbenchmark per backend (workloads/allreduce.py) gives algbw and
busbw per message size beside the raw TCP throughput between the same nodes (iperf3).

Planning, statistics and the results document are pure functions; `report.py` turns the
document into CSV, JSON, Markdown and PNG files.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path

from pycli.check import ALLREDUCE_SCRIPT, NodeFacts, gather_node_facts, human_size, parse_size, run_on_nodes
from pycli.cluster_model import Cluster
from pycli.errors import EXIT_FAILED, EXIT_OK, BadInput
from pycli.job_log import run_logged_job
from pycli.train import JobRequest

BENCH_BACKENDS = ("mpi", "gloo", "nccl")
BENCH_LAUNCHERS = ("horovod", "mpirun", "torchrun")
BENCH_WORKLOADS = ("synthetic", "mnist")
DEFAULT_ALLREDUCE_SIZES = "4K:256M"
IPERF3_PORT = 5201
EXIT_INTERRUPTED = 130
CI95_Z = 1.96  # mean ± 1.96 σ: the 95 % interval of a normal spread

WITHIN = "within one server"
ACROSS = "across servers"


# --- the request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRequest:
    backends: tuple[str, ...]
    process_counts: tuple[int, ...]
    launchers: tuple[str, ...] = ("horovod",)
    workload: str = "synthetic"
    repeat: int = 3
    workload_args: tuple[str, ...] = ()
    allreduce_sizes: str | None = DEFAULT_ALLREDUCE_SIZES  # None: no microbenchmark
    allreduce_iters: int = 5
    iperf_seconds: int = 5


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
        raise BadInput(f"--np {text!r} names no process count; give e.g. --np 1,2,4")
    bad = [part for part in parts if not part.isdigit() or int(part) < 1]
    if bad:
        raise BadInput(f"--np {text!r}: {', '.join(bad)} is not a positive whole number of processes")
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
    allreduce_iters: int = 5, iperf_seconds: int = 5,
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
        launchers=parse_choices(launchers, BENCH_LAUNCHERS, "--launchers"),
        workload=workload, repeat=repeat, workload_args=tuple(workload_args),
        allreduce_sizes=allreduce_sizes, allreduce_iters=allreduce_iters, iperf_seconds=iperf_seconds,
    )


# --- the matrix ----------------------------------------------------------------------------


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
            return f"Horovod on {', '.join(without)} was built without the {controller.upper() if controller == 'mpi' else 'Gloo'} controller"
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


def training_job(cell: Cell, workload: str, workload_args: Sequence[str]) -> JobRequest:
    """The job of one run of a training cell."""
    args: list[str] = []
    if cell.device == "cpu":
        args.append("--cpu")
    name = workload
    if workload == "mnist" and cell.launcher == "torchrun":
        name = "ddp"  # the same training under DistributedDataParallel
        args += ["--backend", cell.backend]
    return JobRequest(np=cell.placement.processes, workload=name, launcher=cell.launcher,
                      controller=horovodrun_controller(cell), script_args=(*args, *workload_args))


def allreduce_job(cell: Cell, sizes: str, iters: int) -> JobRequest:
    """The job of one allreduce microbenchmark."""
    if cell.launcher == "torchrun":
        args = ["--comm", "torch", "--backend", cell.backend]
    else:
        args = ["--comm", "horovod"]
    if cell.device == "cpu":
        args.append("--cpu")
    args += ["--sizes", sizes, "--iters", str(iters), "--metrics", "metrics.jsonl"]
    return JobRequest(np=cell.placement.processes, workload=str(ALLREDUCE_SCRIPT), launcher=cell.launcher,
                      controller=horovodrun_controller(cell), script_args=tuple(args))


# --- one placement = one cluster in memory ------------------------------------------------


def placement_cluster(cluster: Cluster, place: Placement) -> Cluster:
    """`cluster` with every host's `slots` set for `place`; on one server, no network interface.

    Jobs fill hosts in inventory order, so N servers x P processes is np = N·P over hosts of
    P slots each. No NIC carries a one-server job, and horovodrun with --network-interface on
    a single host fails ("No interface is found for address 127.0.0.1"), as it runs that
    host's ranks locally.
    """
    settings = dict(cluster.settings)
    if place.servers == 1:
        settings.pop("pycli_network_interface", None)
    hosts = tuple(replace(host, slots=place.per_server) for host in cluster.hosts)
    return replace(cluster, hosts=hosts, settings=settings)


# --- measurements and statistics -----------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """What one run of a training workload measured (rank 0's metrics record)."""

    step_time_s: float
    throughput: float  # samples per second, all ranks together
    throughput_ci95: float | None  # the spread over the run's own iterations, when it reports one
    step_time_ci95: float | None
    peak_memory_mb: float | None
    final_loss: float | None
    val_accuracy: float | None


def measurement_from_records(workload: str, records: Sequence[Mapping]) -> Measurement | None:
    """The run's figures from its metrics records; None when the records hold none."""
    if not records:
        return None
    last = records[-1]
    if workload == "synthetic" and "total_img_per_s" in last:
        ranks = int(last.get("ranks", 1))
        spread = last.get("img_per_s_per_rank_ci95")
        step = float(last["step_time_s"])
        # A step takes batch / rate, so its relative spread is the rate's (to first order).
        relative = None if spread is None else float(spread) / float(last["img_per_s_per_rank"])
        return Measurement(
            step_time_s=step, throughput=float(last["total_img_per_s"]),
            throughput_ci95=None if spread is None else float(spread) * ranks,
            step_time_ci95=None if relative is None else step * relative,
            peak_memory_mb=_number(last.get("peak_memory_mb")), final_loss=None, val_accuracy=None,
        )
    if workload == "mnist" and "samples_per_s" in last:
        step_std = last.get("step_time_std_s")
        return Measurement(
            step_time_s=float(last["step_time_s"]), throughput=float(last["samples_per_s"]), throughput_ci95=None,
            step_time_ci95=None if step_std is None else CI95_Z * float(step_std),
            peak_memory_mb=_number(last.get("peak_memory_mb")), final_loss=_number(last.get("train_loss")),
            val_accuracy=_number(last.get("val_accuracy")),
        )
    return None


def _number(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95 % interval (mean ± 1.96 σ) and where the spread came from."""

    mean: float
    ci95: float | None
    n: int
    spread_from: str  # "repeats", "iterations" (one run's own), or "none"


def estimate(values: Sequence[float], in_run_ci95: float | None = None) -> Estimate:
    """Over --repeat runs the spread is theirs; a single run falls back to its own iterations'."""
    if not values:
        raise ValueError("no values")
    if len(values) > 1:
        return Estimate(statistics.fmean(values), CI95_Z * statistics.stdev(values), len(values), "repeats")
    if in_run_ci95 is not None:
        return Estimate(values[0], in_run_ci95, 1, "iterations")
    return Estimate(values[0], None, 1, "none")


def ratio(top: Estimate, bottom: Estimate, scale: float = 1.0) -> Estimate:
    """top / bottom / scale, its spread by relative errors in quadrature (independent runs)."""
    value = top.mean / bottom.mean / scale
    if top.ci95 is None or bottom.ci95 is None:
        return Estimate(value, None, min(top.n, bottom.n), "none")
    spread = value * math.hypot(top.ci95 / top.mean, bottom.ci95 / bottom.mean)
    both = "repeats" if top.spread_from == bottom.spread_from == "repeats" else "iterations"
    return Estimate(value, spread, min(top.n, bottom.n), both)


@dataclass(frozen=True)
class RunResult:
    cell: Cell
    repeat: int
    exit_code: int
    run_dir: Path
    seconds: float
    measurement: Measurement | None = None
    error: str = ""


@dataclass(frozen=True)
class CellSummary:
    cell: Cell
    runs: tuple[RunResult, ...]
    step_time_s: Estimate | None
    throughput: Estimate | None
    speedup: Estimate | None
    efficiency: Estimate | None
    peak_memory_mb: float | None
    final_loss: float | None
    val_accuracy: float | None

    @property
    def runs_ok(self) -> int:
        return sum(run.measurement is not None for run in self.runs)

    @property
    def status(self) -> str:
        if not self.runs:
            return "not run"  # interrupted before its turn
        if self.runs_ok == len(self.runs):
            return "ok"
        return "failed" if self.runs_ok == 0 else "partly failed"


def summarize(cells: Sequence[Cell], runs: Sequence[RunResult]) -> list[CellSummary]:
    """Each cell's estimates over its runs; speed-up against the same launcher/backend's 1x1."""
    by_cell: dict[Cell, list[RunResult]] = {cell: [] for cell in cells}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    throughput: dict[Cell, Estimate] = {}
    partial: list[tuple[Cell, list[RunResult], list[Measurement]]] = []
    for cell, cell_runs in by_cell.items():
        good = [run.measurement for run in cell_runs if run.measurement is not None]
        if good:
            in_run = good[0].throughput_ci95 if len(good) == 1 else None
            throughput[cell] = estimate([m.throughput for m in good], in_run)
        partial.append((cell, cell_runs, good))
    summaries = []
    for cell, cell_runs, good in partial:
        base = throughput.get(Cell(cell.launcher, cell.backend, Placement(1, 1)))
        mine = throughput.get(cell)
        if mine is None or base is None:
            speedup = efficiency = None
        elif mine is base:  # the baseline against itself: exactly 1, no spread
            speedup = efficiency = Estimate(1.0, 0.0, mine.n, mine.spread_from)
        else:
            speedup = ratio(mine, base)
            efficiency = ratio(mine, base, cell.placement.processes)
        summaries.append(CellSummary(
            cell=cell, runs=tuple(cell_runs),
            step_time_s=estimate([m.step_time_s for m in good], good[0].step_time_ci95 if len(good) == 1 else None)
            if good else None,
            throughput=mine, speedup=speedup, efficiency=efficiency,
            peak_memory_mb=max((m.peak_memory_mb for m in good if m.peak_memory_mb is not None), default=None),
            final_loss=_mean([m.final_loss for m in good]),
            val_accuracy=_mean([m.val_accuracy for m in good]),
        ))
    return summaries


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


# --- raw TCP between two servers (iperf3) --------------------------------------------------


@dataclass(frozen=True)
class TcpLink:
    client: str
    server: str
    gbit_per_s: float | None  # None: not measured, `note` says why
    seconds: int = 0
    note: str = ""


def parse_iperf3(output: str) -> float:
    """Received bits per second from `iperf3 -J` output; ValueError with iperf3's own error."""
    start = output.find("{")
    if start < 0:
        raise ValueError(output.strip().splitlines()[-1] if output.strip() else "iperf3 printed nothing")
    data = json.loads(output[start:])
    if data.get("error"):
        raise ValueError(str(data["error"]))
    return float(data["end"]["sum_received"]["bits_per_second"])


def tcp_commands(server_address: str, seconds: int, pidfile: str) -> tuple[str, str, str]:
    """(start the one-shot server, run the client with retries, stop a server left waiting)."""
    server = shlex.join(["iperf3", "-s", "-1", "-D", "-p", str(IPERF3_PORT), "-I", pidfile])
    client_argv = shlex.join(["iperf3", "-c", server_address, "-p", str(IPERF3_PORT), "-t", str(seconds), "-J"])
    client = (f"for attempt in 1 2 3 4 5; do out=$({client_argv} 2>&1) && break; sleep 1; done; "
              'printf "%s\\n" "$out"')
    stop = f'if [ -f {shlex.quote(pidfile)} ]; then kill "$(cat {shlex.quote(pidfile)})" 2>/dev/null; rm -f {shlex.quote(pidfile)}; fi; true'
    return server, client, stop


def measure_tcp(cluster: Cluster, facts: Mapping[str, NodeFacts], run_dir: Path, seconds: int) -> TcpLink:
    """iperf3 from the first server to the second; a note instead of a number when it cannot run."""
    hosts = cluster.hosts
    if len(hosts) < 2:
        return TcpLink(hosts[0].name, "", None, note="one server: there is no network link between servers to measure")
    client, server = hosts[0], hosts[1]
    missing = [h.name for h in (client, server) if not facts[h.name].iperf3]
    if missing:
        return TcpLink(client.name, server.name, None,
                       note=f"raw TCP not measured: iperf3 is not installed on {', '.join(missing)}")
    pidfile = f"/tmp/pycli-bench-iperf3-{os.getpid()}.pid"
    start, measure, stop = tcp_commands(server.address, seconds, pidfile)
    folder = run_dir / "iperf3"
    try:
        started = run_on_nodes(cluster, [server.name], folder / "server", start)[server.name]
        if not started.ok:
            return TcpLink(client.name, server.name, None, note=f"raw TCP not measured: iperf3 -s on {server.name}: {started.why()}")
        answer = run_on_nodes(cluster, [client.name], folder / "client", measure)[client.name]
    finally:
        run_on_nodes(cluster, [server.name], folder / "stop", stop)
    (folder / "client.json").write_text(answer.stdout)
    try:
        bits = parse_iperf3(answer.stdout)
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        return TcpLink(client.name, server.name, None, note=f"raw TCP not measured: iperf3 -c failed: {exc}")
    return TcpLink(client.name, server.name, bits / 1e9, seconds)


# --- the results document (input of report.py) ---------------------------------------------


def _estimate_fields(prefix: str, value: Estimate | None, scale: float = 1.0) -> dict:
    if value is None:
        return {prefix: None, f"{prefix}_ci95": None}
    return {prefix: value.mean * scale, f"{prefix}_ci95": None if value.ci95 is None else value.ci95 * scale}


def _cell_fields(cell: Cell) -> dict:
    return {"launcher": cell.launcher, "backend": cell.backend, "device": cell.device,
            "servers": cell.placement.servers, "processes_per_server": cell.placement.per_server,
            "processes": cell.placement.processes, "scope": cell.placement.scope}


def cell_document(summary: CellSummary) -> dict:
    spread = summary.throughput.spread_from if summary.throughput else "none"
    return {
        **_cell_fields(summary.cell), "status": summary.status, "reason": "",
        "runs": len(summary.runs), "runs_ok": summary.runs_ok,
        **_estimate_fields("step_time_ms", summary.step_time_s, 1e3),
        **_estimate_fields("throughput", summary.throughput),
        **_estimate_fields("speedup", summary.speedup),
        **_estimate_fields("efficiency", summary.efficiency),
        "spread_from": spread,
        "peak_memory_mb": summary.peak_memory_mb, "final_loss": summary.final_loss,
        "val_accuracy": summary.val_accuracy,
        "repeats": [run_document(run) for run in summary.runs],
    }


def run_document(run: RunResult) -> dict:
    m = run.measurement
    return {
        **_cell_fields(run.cell), "repeat": run.repeat, "exit_code": run.exit_code, "seconds": round(run.seconds, 1),
        "step_time_ms": m.step_time_s * 1e3 if m else None, "throughput": m.throughput if m else None,
        "peak_memory_mb": m.peak_memory_mb if m else None, "final_loss": m.final_loss if m else None,
        "val_accuracy": m.val_accuracy if m else None, "error": run.error, "run_dir": str(run.run_dir),
    }


def skipped_document(skip: Skipped) -> dict:
    return {**_cell_fields(skip.cell), "status": "skipped", "reason": skip.reason, "runs": 0, "runs_ok": 0}


def facts_document(facts: NodeFacts) -> dict:
    data = asdict(facts)
    build = facts.horovod_build
    data["horovod_build"] = build.describe() if build else ""
    return data


@dataclass
class AllreduceRun:
    cell: Cell
    exit_code: int
    run_dir: Path
    records: list[dict] = field(default_factory=list)
    error: str = ""


def allreduce_document(run: AllreduceRun) -> dict:
    status = "ok" if run.exit_code == 0 and run.records else "failed"
    return {**_cell_fields(run.cell), "status": status, "reason": run.error, "run_dir": str(run.run_dir),
            "sizes": run.records}


def results_document(
    *, inventory: Path, request: BenchRequest, run_dir: Path, started: datetime, seconds: float, interrupted: bool,
    nodes: Sequence[NodeFacts], summaries: Sequence[CellSummary], skipped: Sequence[Skipped],
    allreduce_runs: Sequence[AllreduceRun], allreduce_skipped: Sequence[Skipped], tcp: TcpLink | None,
) -> dict:
    """Everything the bench found, as plain data: results.json, and what report.py renders."""
    return {
        "command": request_command(inventory, request),
        "inventory": str(inventory),
        "run_dir": str(run_dir),
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "workload": request.workload,
        "throughput_unit": "img/s" if request.workload == "synthetic" else "samples/s",
        "repeat": request.repeat,
        "interrupted": interrupted,
        "environment": [facts_document(node) for node in nodes],
        "cells": [cell_document(summary) for summary in summaries] + [skipped_document(skip) for skip in skipped],
        "allreduce": [allreduce_document(run) for run in allreduce_runs]
        + [{**skipped_document(skip), "sizes": []} for skip in allreduce_skipped],
        "tcp": asdict(tcp) if tcp else None,
    }


# --- running it ----------------------------------------------------------------------------


def _run_job(cluster: Cluster, job: JobRequest, run_dir: Path) -> tuple[int, tuple[dict, ...], str]:
    """One job with its output in run_dir/output.log: (exit code, metrics records, error)."""
    done = run_logged_job(cluster, job, run_dir)
    if done.refused or done.code == 0:
        return done.code, done.records, done.refused
    return done.code, done.records, f"exit {done.code}: {done.failure()}"


def _format_run(run: RunResult, workload: str) -> str:
    m = run.measurement
    if m is None:
        return f"FAILED ({run.error or 'no metrics'}); output in {run.run_dir / 'output.log'}"
    unit = "img/s" if workload == "synthetic" else "samples/s"
    return f"{m.throughput:.1f} {unit}, step {m.step_time_s * 1e3:.1f} ms ({run.seconds:.0f} s)"


def request_command(inventory: Path, request: BenchRequest) -> str:
    """The command line that makes this bench again (for the report)."""
    argv = ["pycli", "bench", "-i", str(inventory), "--backends", ",".join(request.backends),
            "--np", ",".join(map(str, request.process_counts)), "--launchers", ",".join(request.launchers),
            "--workload", request.workload, "--repeat", str(request.repeat)]
    if request.allreduce_sizes is None:
        argv.append("--no-allreduce")
    else:
        argv += ["--allreduce-sizes", request.allreduce_sizes, "--allreduce-iters", str(request.allreduce_iters),
                 "--iperf-seconds", str(request.iperf_seconds)]
    if request.workload_args:
        argv += ["--", *request.workload_args]
    return shlex.join(argv)


def bench(cluster: Cluster, request: BenchRequest, *, write: Callable[[str], None] = print) -> int:
    """Run the matrix on the cluster's nodes and write the report; the exit code says if all ran."""
    from pycli.paths import new_run_dir
    from pycli.report import skipped_lines, write_report

    inventory = cluster.inventory_path
    hosts = cluster.hosts
    names = [host.name for host in hosts]
    run_dir = new_run_dir("bench")
    started = datetime.now()
    began = time.monotonic()
    write(f"pycli: bench on {len(hosts)} servers of {inventory}; run folder {run_dir}")
    facts = gather_node_facts(cluster, names, run_dir)
    nodes = [node_capacity(facts[name]) for name in names]
    cells, skipped = plan_matrix(request, nodes)
    allreduce_cells, allreduce_skipped = plan_allreduce(request, nodes)
    skips = {"cells": [skipped_document(skip) for skip in skipped],
             "allreduce": [skipped_document(skip) for skip in allreduce_skipped]}
    for line in skipped_lines(skips):
        write(f"pycli: skip {line}")

    runs: list[RunResult] = []
    allreduce_runs: list[AllreduceRun] = []
    tcp: TcpLink | None = None
    interrupted = False
    total = len(cells) * request.repeat
    try:
        for repeat in range(1, request.repeat + 1):
            for cell in cells:
                if interrupted:
                    break
                cell_dir = run_dir / "runs" / f"{cell.key}-r{repeat}"
                write(f"pycli: [{len(runs) + 1}/{total}] {cell.describe()}, run {repeat}/{request.repeat} ...")
                job_began = time.monotonic()
                code, records, error = _run_job(placement_cluster(cluster, cell.placement),
                                                training_job(cell, request.workload, request.workload_args), cell_dir)
                measurement = measurement_from_records(request.workload, records) if code == 0 else None
                if code == 0 and measurement is None:
                    error = "the job wrote no metrics record"
                run = RunResult(cell, repeat, code, cell_dir, time.monotonic() - job_began, measurement, error)
                runs.append(run)
                write(f"pycli:     {_format_run(run, request.workload)}")
                interrupted = code == EXIT_INTERRUPTED
        for cell in allreduce_cells:
            if interrupted:
                break
            cell_dir = run_dir / "allreduce" / cell.key
            write(f"pycli: allreduce microbenchmark: {cell.describe()}, sizes {request.allreduce_sizes} ...")
            code, records, error = _run_job(placement_cluster(cluster, cell.placement),
                                            allreduce_job(cell, request.allreduce_sizes or "", request.allreduce_iters), cell_dir)
            allreduce_runs.append(AllreduceRun(cell, code, cell_dir, list(records), error))
            if records:
                write(f"pycli:     busbw {records[-1]['busbw_gbps']:.3g} GB/s at {human_size(records[-1]['bytes'])}")
            else:
                write(f"pycli:     FAILED ({error or 'no results'}); output in {cell_dir / 'output.log'}")
            interrupted = code == EXIT_INTERRUPTED
        if not interrupted and request.allreduce_sizes is not None:
            tcp = measure_tcp(cluster, facts, run_dir, request.iperf_seconds)
            write(f"pycli: raw TCP {tcp.client} -> {tcp.server}: "
                  + (f"{tcp.gbit_per_s:.2f} Gbit/s (iperf3, {tcp.seconds} s)" if tcp.gbit_per_s is not None else tcp.note))
    except KeyboardInterrupt:
        interrupted = True
    document = results_document(
        inventory=inventory, request=request, run_dir=run_dir, started=started, seconds=time.monotonic() - began,
        interrupted=interrupted, nodes=[facts[name] for name in names], summaries=summarize(cells, runs),
        skipped=skipped, allreduce_runs=allreduce_runs, allreduce_skipped=allreduce_skipped, tcp=tcp,
    )
    written = write_report(document, run_dir)
    write(f"pycli: report {run_dir / 'report.md'}; also {', '.join(path.name for path in written if path.name != 'report.md')}")
    if interrupted:
        write("pycli: interrupted; the report holds the runs that finished")
        return EXIT_INTERRUPTED
    if not cells:
        write("pycli: nothing was measured: every combination was skipped (reasons above)")
        return EXIT_FAILED
    failures = sum(run.measurement is None for run in runs) + sum(run.exit_code != 0 or not run.records for run in allreduce_runs)
    if failures:
        write(f"pycli: {failures} run(s) failed; see the report and each run's output.log")
        return EXIT_FAILED
    return EXIT_OK

