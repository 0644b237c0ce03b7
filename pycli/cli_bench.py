"""`pycli bench`: the backend-by-scale lab and the torchrun-versus-Horovod comparison."""

from __future__ import annotations

from pathlib import Path

import typer

# The command's defaults; tests/unit/test_bench.py keeps them equal to pycli.bench_plan's. The
# module itself is imported when the command runs, so `pycli --help` stays quick.
DEFAULT_ALLREDUCE_SIZES = "4K:256M"


def bench_cmd(
    workload_args: list[str] = typer.Argument(
        None, help="Extra arguments for the workload, after '--'; an inventory may come before them."
    ),
    inventory: Path | None = typer.Option(
        None, "--inventory", "-i", help="Or as the first argument. Default: the local cluster that is up."
    ),
    backends: str = typer.Option("mpi,gloo,nccl", "--backends", help="Collective libraries that move the tensors, comma-separated: mpi, gloo, nccl."),
    process_counts: str = typer.Option("1,2,4", "--np", help="Process counts, comma-separated (1 is always run: the baseline)."),
    workload: str = typer.Option("synthetic", "--workload", help="synthetic (ResNet-style, random data) or mnist (digits)."),
    launchers: str = typer.Option("horovod", "--launchers", help="Comma-separated: horovod (horovodrun), mpirun, torchrun."),
    repeat: int = typer.Option(3, "--repeat", help="Runs per combination; the spread is taken over them."),
    allreduce_sizes: str = typer.Option(DEFAULT_ALLREDUCE_SIZES, "--allreduce-sizes", help="MIN:MAX (doubling) or a comma list, e.g. 4K:256M."),
    allreduce_iters: int = typer.Option(5, "--allreduce-iters", help="Timed allreduces per size."),
    no_allreduce: bool = typer.Option(False, "--no-allreduce", help="Skip the allreduce microbenchmark and iperf3."),
    iperf_seconds: int = typer.Option(5, "--iperf-seconds", help="Length of the raw TCP measurement."),
    env: list[str] = typer.Option(None, "--env", metavar="NAME=VALUE", help="Set for every rank of every run (repeatable), as pycli train --env."),
) -> None:
    """Run WORKLOAD over each backend and launcher on 1..N processes, within and across servers; write a report.

    The inventory may come first (pycli bench INVENTORY ...) or with -i."""
    from pycli.bench import bench
    from pycli.bench_plan import bench_request
    from pycli.cli_options import given_inventory, leading_inventory, load_inventory, say_to_stderr
    from pycli.drained import for_jobs

    positional, workload_args = leading_inventory(workload_args or [])
    inventory = given_inventory(positional, inventory)

    request = bench_request(
        backends=backends, process_counts=process_counts, launchers=launchers, workload=workload, repeat=repeat,
        workload_args=workload_args or [], allreduce_sizes=None if no_allreduce else allreduce_sizes,
        allreduce_iters=allreduce_iters, iperf_seconds=iperf_seconds, env=env or (),
    )
    raise typer.Exit(bench(for_jobs(load_inventory(inventory), say_to_stderr), request))
