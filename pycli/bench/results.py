"""The results document of `pycli bench`: everything it found as plain data.

It is results.json, and what pycli.bench.report renders as CSV, Markdown and plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pycli.bench.plan import BenchRequest, Cell, Skipped, request_command
from pycli.bench.stats import CellRun, CellSummary, Estimate
from pycli.cluster.iperf import TcpLink
from pycli.cluster.node_facts import NodeFacts
from pycli.core.json_documents import RESULTS, versioned


def _estimate_fields(prefix: str, value: Estimate | None, scale: float = 1.0) -> dict[str, Any]:
    if value is None:
        return {prefix: None, f"{prefix}_ci95": None}
    return {prefix: value.mean * scale, f"{prefix}_ci95": None if value.ci95 is None else value.ci95 * scale}


def _cell_fields(cell: Cell) -> dict[str, Any]:
    return {"launcher": cell.launcher, "backend": cell.backend, "device": cell.device,
            "servers": cell.placement.servers, "processes_per_server": cell.placement.per_server,
            "processes": cell.placement.processes, "scope": cell.placement.scope}


def cell_document(summary: CellSummary) -> dict[str, Any]:
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


def run_document(run: CellRun) -> dict[str, Any]:
    m = run.measurement
    return {
        **_cell_fields(run.cell), "repeat": run.repeat, "exit_code": run.exit_code, "seconds": round(run.seconds, 1),
        "step_time_ms": m.step_time_s * 1e3 if m else None, "throughput": m.throughput if m else None,
        "peak_memory_mb": m.peak_memory_mb if m else None, "final_loss": m.final_loss if m else None,
        "val_accuracy": m.val_accuracy if m else None, "error": run.error, "run_dir": str(run.run_dir),
    }


def skipped_document(skip: Skipped) -> dict[str, Any]:
    return {**_cell_fields(skip.cell), "status": "skipped", "reason": skip.reason, "runs": 0, "runs_ok": 0}


def facts_document(facts: NodeFacts) -> dict[str, Any]:
    data = asdict(facts)
    build = facts.horovod_build
    data["horovod_build"] = build.describe() if build else ""
    return data


@dataclass
class AllreduceRun:
    cell: Cell
    exit_code: int
    run_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


def allreduce_document(run: AllreduceRun) -> dict[str, Any]:
    status = "ok" if run.exit_code == 0 and run.records else "failed"
    return {**_cell_fields(run.cell), "status": status, "reason": run.error, "run_dir": str(run.run_dir),
            "sizes": run.records}


def results_document(
    *, inventory: Path, request: BenchRequest, run_dir: Path, started: datetime, seconds: float, interrupted: bool,
    nodes: Sequence[NodeFacts], summaries: Sequence[CellSummary], skipped: Sequence[Skipped],
    allreduce_runs: Sequence[AllreduceRun], allreduce_skipped: Sequence[Skipped], tcp: TcpLink | None,
) -> dict[str, Any]:
    """Everything the bench found, as plain data: results.json, and what pycli.bench.report renders."""
    return versioned(RESULTS, {
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
    })
