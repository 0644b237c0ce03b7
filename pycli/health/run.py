"""`pycli check`: run the gates in order, show each result, write check.json."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pycli.cluster.model import Cluster, Drained
from pycli.core.errors import EXIT_FAILED, EXIT_OK, notice
from pycli.core.json_documents import CHECK, versioned
from pycli.core.paths import new_run_dir
from pycli.health.gates import FAIL, GATES, NOT_RUN, PASS, REACHABLE, SKIP, CheckContext, Gate, GateResult
from pycli.health.options import CheckOptions
from pycli.jobs.slurm import HOLD_NAME_PREFIX

if TYPE_CHECKING:
    from pycli.jobs.slurm_hold import Hold


def run_gates(
    gates: Sequence[Gate], ctx: CheckContext, on_result: Callable[[GateResult], None] = lambda result: None
) -> list[GateResult]:
    """Each gate in order, timed; after the first failure the rest are `not run`, but for those
    that run after a failure (the deep gates) unless no node could be reached."""
    results: list[GateResult] = []
    stopped_by: str | None = None
    for gate in gates:
        if stopped_by is not None and not (gate.after_failure and stopped_by != REACHABLE):
            result = GateResult(gate.name, NOT_RUN)
        else:
            began = time.monotonic()
            result = replace(gate.run(ctx), name=gate.name, seconds=time.monotonic() - began)
            if result.stops and gate.stops_the_check and stopped_by is None:
                stopped_by = gate.name
        results.append(result)
        on_result(result)
    return results


def exit_code(results: Sequence[GateResult]) -> int:
    failure = next((result for result in results if result.status == FAIL), None)
    return EXIT_OK if failure is None else failure.exit_code


def result_line(index: int, result: GateResult) -> str:
    """One gate as the user reads it; a failure's message on the next line."""
    label = {PASS: "PASS", FAIL: "FAIL", SKIP: "SKIP", NOT_RUN: "----"}[result.status]
    timing = f" ({result.seconds:.1f} s)" if result.status in (PASS, FAIL) else ""
    line = f"{label} {index:>2} {result.name:<15} {result.figure or ('not run' if result.status == NOT_RUN else '')}{timing}"
    if result.status == FAIL:
        line += f"\n        {result.message}"
    return line.rstrip()


def report_json(inventory: Path, run_dir: Path, results: Sequence[GateResult], drained: Sequence[Drained] = ()) -> dict[str, Any]:
    failure = next((result.name for result in results if result.status == FAIL), None)
    return versioned(CHECK, {
        "inventory": str(inventory),
        "run_dir": str(run_dir),
        "passed": failure is None,
        "failed_gate": failure,
        "exit_code": exit_code(results),
        "drained": [asdict(entry) for entry in drained],
        "gates": [{**{key: value for key, value in asdict(result).items() if key != "exit_code"},
                   "seconds": round(result.seconds, 2)} for result in results],
    })


def gates_for(options: CheckOptions) -> tuple[Gate, ...]:
    """The usual gates, and the deep ones after them with --deep; with --deep-only, whether
    every node answers and then the deep ones."""
    if not options.deep:
        return GATES
    from pycli.health.deep import DEEP_GATES

    return (GATES[0], *DEEP_GATES) if options.deep_only else GATES + DEEP_GATES


def drain_suspects(cluster: Cluster, suspects: dict[str, str], say: Callable[[str], None]) -> list[str]:
    """--fence: the nodes the deep gates named go on the drained list, each with its figure, and
    on a cluster with Slurm to Slurm's DRAIN with the same reason."""
    from pycli.cluster.drained import fence
    from pycli.cluster.slurm_state import set_drained

    entries = fence(cluster, suspects)
    set_drained(cluster, {entry.node: entry.reason for entry in entries}, say)
    return [entry.describe() for entry in entries]


def check(cluster: Cluster, options: CheckOptions, *, as_json: bool = False, write: Callable[[str], None] = print) -> int:
    """Run every gate against the cluster's nodes; the exit code is 0 only when all pass. On a
    cluster with Slurm, the nodes a job runs on are left out and the idle ones held for the
    check's whole run (pycli.jobs.slurm_hold)."""
    run_dir = new_run_dir("check")
    if not cluster.has_slurm:
        return _check(cluster, options, run_dir, as_json=as_json, write=write)
    from pycli.jobs.slurm_hold import held_for_check

    with held_for_check(cluster, f"{HOLD_NAME_PREFIX}{run_dir.name}", notice if as_json else write) as hold:
        return _check(hold.cluster, options, run_dir, as_json=as_json, write=write, hold=hold)


def _check(cluster: Cluster, options: CheckOptions, run_dir: Path, *, as_json: bool, write: Callable[[str], None],
           hold: Hold | None = None) -> int:
    inventory = cluster.inventory_path
    ctx = CheckContext(cluster=cluster, run_dir=run_dir, options=options)
    if not as_json:
        write(f"pycli: checking {len(cluster.hosts)} nodes of {inventory}; run folder {run_dir}")
        for entry in cluster.drained:  # checked too: a repaired node shows it here before it is undrained
            write(f"pycli: drained: {entry.describe()}")
    slurm_lines = []
    if cluster.has_slurm:  # Slurm's own drains (its health check's, an admin's) beside pycli's list
        from pycli.cluster.slurm_state import unavailable_lines

        slurm_lines = unavailable_lines(cluster)
        if not as_json:
            for line in slurm_lines:
                write(f"pycli: {line}")
    counter = iter(range(1, len(gates_for(options)) + 1))

    def show(result: GateResult) -> None:
        index = next(counter)
        if not as_json:
            write(result_line(index, result))

    results = run_gates(gates_for(options), ctx, on_result=show)
    summary = report_json(inventory, run_dir, results, cluster.drained)
    if cluster.has_slurm:
        summary["slurm"] = slurm_lines
    if hold is not None:
        summary["slurm_hold"] = hold.as_json()
        if hold.slurm_error:  # the gates ran, unheld: the cluster still fails its check
            summary.update(passed=False, exit_code=summary["exit_code"] or EXIT_FAILED)
    if options.deep:
        summary["deep"] = {**ctx.deep, "suspects": ctx.suspects}
        (run_dir / "deep.json").write_text(json.dumps(summary["deep"], indent=2) + "\n")
    if options.fence and ctx.suspects:
        fenced = drain_suspects(cluster, ctx.suspects, notice if as_json else write)
        summary["fenced"] = fenced
        if not as_json:
            for line in fenced:
                write(f"pycli: fenced {line}; 'pycli undrain' takes it back")
    (run_dir / CHECK.file_name).write_text(json.dumps(summary, indent=2) + "\n")
    if as_json:
        write(json.dumps(summary, indent=2))
    elif summary["passed"]:
        write(f"pycli: all {sum(r.status == PASS for r in results)} gates passed"
              f"{'' if all(r.status == PASS for r in results) else ' (the others do not apply here)'}")
    elif summary["failed_gate"] is None:
        write(f"pycli: check failed: Slurm cannot be asked ({hold.slurm_error if hold else ''}); details in {run_dir}")
    else:
        write(f"pycli: check failed at gate '{summary['failed_gate']}'; details in {run_dir}")
    return int(summary["exit_code"])
