"""`pycli check INVENTORY`: health gates, in order, stopping at the first failure."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli_options import INVENTORY_HELP, INVENTORY_OPTION

# The command's defaults; tests/unit/test_check.py keeps them equal to pycli.check's. The
# module itself is imported when the command runs, so `pycli --help` stays quick.
DEFAULT_CUDA_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu22.04"
DEFAULT_COMPUTE_FRACTION = 0.6
DEFAULT_LINK_FRACTION = 0.5
DEFAULT_DCGM_LEVEL = 1


def check_cmd(
    inventory: Path | None = typer.Argument(None, help=INVENTORY_HELP, show_default=False),
    inventory_option: Path | None = INVENTORY_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the gates' results as JSON (for machines)."),
    busbw_floor: float = typer.Option(0.0, "--busbw-floor", help="Least allreduce bus bandwidth in GB/s (0: no floor)."),
    controller: str | None = typer.Option(
        None, "--controller", help="horovodrun's controller for the allreduce gate: gloo (default) or mpi."
    ),
    backend: str | None = typer.Option(None, "--backend", hidden=True, help="Old name of --controller."),
    allreduce_size: str = typer.Option("64M", "--allreduce-size", help="Message size of the allreduce gate."),
    controllers: str = typer.Option("gloo,mpi", "--controllers", help="Horovod controllers every node's build must have (the horovod_build gate)."),
    cuda_image: str = typer.Option(DEFAULT_CUDA_IMAGE, "--cuda-image", help="Image for the docker --gpus all gate."),
    deep: bool = typer.Option(False, "--deep", help="Also measure every node's compute and every pair's link, and name the slow ones."),
    deep_only: bool = typer.Option(False, "--deep-only", help="Only whether every node answers, then the deep gates."),
    fence: bool = typer.Option(False, "--fence", help="With --deep: put the nodes it names on the drained list."),
    compute_fraction: float = typer.Option(
        DEFAULT_COMPUTE_FRACTION, "--compute-fraction", help="With --deep: a node below this share of the others' median compute is named."
    ),
    link_fraction: float = typer.Option(
        DEFAULT_LINK_FRACTION, "--link-fraction", help="With --deep: a pair below this share of the other pairs' median TCP is named."
    ),
    dcgm_level: int = typer.Option(
        DEFAULT_DCGM_LEVEL, "--dcgm-level", help="With --deep, on GPU nodes with DCGM: dcgmi diag -r LEVEL (1 quick to 4 hours; 0 skips it)."
    ),
) -> None:
    """Check INVENTORY's nodes gate by gate: reachable, SSH mesh, same software, Horovod build, mpirun,
    allreduce, and on GPU nodes nvidia-smi, driver/library match and docker --gpus all."""
    from pycli.check import check_options
    from pycli.check_run import check
    from pycli.cli_options import controller_option, load_inventory, required_inventory

    options = check_options(
        busbw_floor_gbps=busbw_floor, controller=controller_option(controller, backend), allreduce_size=allreduce_size, controllers=controllers,
        cuda_image=cuda_image, deep=deep, deep_only=deep_only, fence=fence, compute_fraction=compute_fraction, link_fraction=link_fraction,
        dcgm_level=dcgm_level,
    )
    cluster = load_inventory(required_inventory(inventory, inventory_option))
    raise typer.Exit(check(cluster, options, as_json=as_json))
