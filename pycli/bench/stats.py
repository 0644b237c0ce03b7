"""What a bench run measured and the statistics over its repeats: means, 95 % spreads, speed-up, efficiency."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycli.bench.plan import Cell, Placement

CI95_Z = 1.96  # mean ± 1.96 σ: the 95 % interval of a normal spread


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


def measurement_from_records(workload: str, records: Sequence[Mapping[str, Any]]) -> Measurement | None:
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
class CellRun:
    """One run of a cell (one of its --repeat runs) and what it measured."""

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
    runs: tuple[CellRun, ...]
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


def summarize(cells: Sequence[Cell], runs: Sequence[CellRun]) -> list[CellSummary]:
    """Each cell's estimates over its runs; speed-up against the same launcher/backend's 1x1."""
    by_cell: dict[Cell, list[CellRun]] = {cell: [] for cell in cells}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    throughput: dict[Cell, Estimate] = {}
    partial: list[tuple[Cell, list[CellRun], list[Measurement]]] = []
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
