"""`pycli bench`: the backend-by-scale lab and the torchrun-versus-Horovod comparison."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.bench.plan import BENCH_BACKENDS, BENCH_WORKLOADS, BenchRequest
from pycli.cli.options import INVENTORY_OPTION
from pycli.jobs.launch import LAUNCHERS

DEFAULTS = BenchRequest()


def bench_cmd(
    workload_args: list[str] = typer.Argument(
        None, help="Extra arguments for the workload, after '--'; an inventory may come before them."
    ),
    inventory: Path | None = INVENTORY_OPTION,
    backends: str = typer.Option(
        ",".join(DEFAULTS.backends), "--backends",
        help=f"Collective libraries that move the tensors, comma-separated: {', '.join(BENCH_BACKENDS)}.",
    ),
    np_list: str = typer.Option(
        ",".join(map(str, DEFAULTS.process_counts)), "--np-list",
        help="The --np of each run, comma-separated (1 is always run: the baseline).",
    ),
    workload: str = typer.Option(
        DEFAULTS.workload, "--workload", help=f"One of {', '.join(BENCH_WORKLOADS)} (synthetic: ResNet-style, random data)."
    ),
    launchers: str = typer.Option(
        ",".join(DEFAULTS.launchers), "--launchers", help=f"Comma-separated: {', '.join(LAUNCHERS)} (horovod: horovodrun)."
    ),
    repeat: int = typer.Option(DEFAULTS.repeat, "--repeat", help="Runs per combination; the spread is taken over them."),
    allreduce_sizes: str = typer.Option(
        DEFAULTS.allreduce_sizes, "--allreduce-sizes", help="MIN:MAX (doubling) or a comma list, e.g. 4K:256M."
    ),
    allreduce_iters: int = typer.Option(DEFAULTS.allreduce_iters, "--allreduce-iters", help="Timed allreduces per size."),
    no_allreduce: bool = typer.Option(False, "--no-allreduce", help="Skip the allreduce microbenchmark and iperf3."),
    iperf_seconds: int = typer.Option(DEFAULTS.iperf_seconds, "--iperf-seconds", help="Length of the raw TCP measurement."),
    env: list[str] = typer.Option(
        None, "--env", metavar="NAME=VALUE", help="Set for every rank of every run (repeatable), as pycli train --env."
    ),
) -> None:
    """Run WORKLOAD over each backend and launcher on 1..N processes, within and across servers; write a report.

    The inventory may come first (pycli bench INVENTORY ...) or with -i."""
    from pycli.bench.plan import bench_request
    from pycli.bench.run import bench
    from pycli.cli.options import leading_inventory, load_inventory
    from pycli.cluster.drained import for_jobs
    from pycli.core.errors import notice

    positional, workload_args = leading_inventory(workload_args or [])
    request = bench_request(
        backends=backends, process_counts=np_list, launchers=launchers, workload=workload, repeat=repeat,
        workload_args=workload_args or [], allreduce_sizes=None if no_allreduce else allreduce_sizes,
        allreduce_iters=allreduce_iters, iperf_seconds=iperf_seconds, env=env or (),
    )
    raise typer.Exit(bench(for_jobs(load_inventory(positional, inventory), notice), request))
