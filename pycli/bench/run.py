"""`pycli bench`: the backend-by-scale lab and the torchrun-versus-Horovod comparison.

The same training workload runs over each communication backend (MPI, Gloo, NCCL) under
each launcher (horovodrun, mpirun, torchrun) on 1..N processes, both within one server and
across servers, `--repeat` times; each run is one `pycli.jobs.train.run_job` job with its own
run folder, on the cluster with its slots set in memory for the run's placement. From the
runs come the mean step time and throughput with their 95 % spread, the speed-up over the
1-process run of the same launcher and backend, and the scaling efficiency (speed-up /
processes). Combinations the cluster cannot run are skipped with the
reason. An allreduce microbenchmark per backend (workloads/allreduce.py) gives algbw and
busbw per message size beside the raw TCP throughput between the same nodes (iperf3).

This module runs it all. The plan (pycli.bench.plan), the statistics (pycli.bench.stats)
and the results document (pycli.bench.results) are pure functions; raw TCP is pycli.cluster.iperf;
pycli.bench.report turns the document into CSV, JSON, Markdown and PNG files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pycli.bench.plan import (
    BenchRequest,
    allreduce_job,
    node_capacity,
    placement_cluster,
    plan_allreduce,
    plan_matrix,
    training_job,
)
from pycli.bench.results import AllreduceRun, results_document, skipped_document
from pycli.bench.stats import CellRun, measurement_from_records, summarize
from pycli.cluster.iperf import TcpLink, measure_tcp
from pycli.cluster.model import Cluster
from pycli.cluster.node_facts import gather_node_facts
from pycli.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from pycli.core.sizes import human_size
from pycli.jobs.log import run_logged_job
from pycli.jobs.request import JobRequest
from pycli.jobs.train import layout_of


def _run_job(cluster: Cluster, job: JobRequest, run_dir: Path) -> tuple[int, tuple[dict[str, Any], ...], str]:
    """One job with its output in run_dir/output.log: (exit code, metrics records, error)."""
    done = run_logged_job(cluster, job, run_dir)
    if done.refused or done.code == 0:
        return done.code, done.records, done.refused
    return done.code, done.records, f"exit {done.code}: {done.failure()}"


def _format_run(run: CellRun, workload: str) -> str:
    m = run.measurement
    if m is None:
        return f"FAILED ({run.error or 'no metrics'}); output in {run.run_dir / 'output.log'}"
    unit = "img/s" if workload == "synthetic" else "samples/s"
    return f"{m.throughput:.1f} {unit}, step {m.step_time_s * 1e3:.1f} ms ({run.seconds:.0f} s)"


def bench(cluster: Cluster, request: BenchRequest, *, write: Callable[[str], None] = print) -> int:
    """Run the matrix on the cluster's nodes and write the report; the exit code says if all ran.
    On a cluster with Slurm, only on the nodes no job runs on, held for the whole run."""
    from pycli.core.paths import new_run_dir

    run_dir = new_run_dir("bench")
    if not cluster.has_slurm:
        return _bench(cluster, request, run_dir, write)
    # On a cluster with Slurm the runs never share a node with someone's job, and no job starts on
    # a node while it is measured: the idle nodes are held, as for pycli check.
    from pycli.jobs.slurm import JOB_NAME_PREFIX
    from pycli.jobs.slurm_hold import held_for_check

    with held_for_check(cluster, f"{JOB_NAME_PREFIX}bench-{run_dir.name}", write, what="bench") as hold:
        return _bench(hold.cluster, request, run_dir, write)


def _bench(cluster: Cluster, request: BenchRequest, run_dir: Path, write: Callable[[str], None]) -> int:
    from pycli.bench.report import skipped_lines, write_report

    inventory = cluster.inventory_path
    hosts = cluster.hosts
    names = [host.name for host in hosts]
    started = datetime.now()
    began = time.monotonic()
    write(f"pycli: bench on {len(hosts)} servers of {inventory}; run folder {run_dir}")
    facts = gather_node_facts(cluster, names, run_dir, layout_of(cluster).venv)
    nodes = [node_capacity(facts[name]) for name in names]
    cells, skipped = plan_matrix(request, nodes)
    allreduce_cells, allreduce_skipped = plan_allreduce(request, nodes)
    skips = {"cells": [skipped_document(skip) for skip in skipped],
             "allreduce": [skipped_document(skip) for skip in allreduce_skipped]}
    for line in skipped_lines(skips):
        write(f"pycli: skip {line}")

    runs: list[CellRun] = []
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
                job = training_job(cell, request.workload, request.workload_args, request.env)
                code, records, error = _run_job(placement_cluster(cluster, cell.placement), job, cell_dir)
                measurement = measurement_from_records(request.workload, records) if code == 0 else None
                if code == 0 and measurement is None:
                    error = "the job wrote no metrics record"
                run = CellRun(cell, repeat, code, cell_dir, time.monotonic() - job_began, measurement, error)
                runs.append(run)
                write(f"pycli:     {_format_run(run, request.workload)}")
                interrupted = code == EXIT_INTERRUPTED
        for cell in allreduce_cells:
            if interrupted:
                break
            cell_dir = run_dir / "allreduce" / cell.key
            write(f"pycli: allreduce microbenchmark: {cell.describe()}, sizes {request.allreduce_sizes} ...")
            job = allreduce_job(cell, request.allreduce_sizes or "", request.allreduce_iters, request.env)
            code, records, error = _run_job(placement_cluster(cluster, cell.placement), job, cell_dir)
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
