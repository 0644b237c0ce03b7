"""`pycli check [INVENTORY]`: health gates, in order, stopping at the first failure."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli.options import INVENTORY_ARGUMENT, INVENTORY_OPTION, JSON_OPTION
from pycli.health.options import DEFAULTS


def check_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    as_json: bool = JSON_OPTION,
    busbw_floor: float = typer.Option(
        DEFAULTS.busbw_floor_gbps, "--busbw-floor", help="Least allreduce bus bandwidth in GB/s (0: no floor)."
    ),
    controller: str = typer.Option(
        DEFAULTS.controller, "--controller", help="horovodrun's controller for the allreduce gate: gloo or mpi."
    ),
    allreduce_size: str = typer.Option(DEFAULTS.allreduce_size, "--allreduce-size", help="Message size of the allreduce gate."),
    build_controllers: str = typer.Option(
        ",".join(DEFAULTS.controllers), "--build-controllers",
        help="Horovod controllers every node's build must have (the horovod_build gate), comma-separated.",
    ),
    cuda_image: str = typer.Option(DEFAULTS.cuda_image, "--cuda-image", help="Image for the docker --gpus all gate."),
    deep: bool = typer.Option(
        False, "--deep", help="Also measure every node's compute and every pair's link, and name the slow ones."
    ),
    deep_only: bool = typer.Option(False, "--deep-only", help="Only whether every node answers, then the deep gates."),
    fence: bool = typer.Option(False, "--fence", help="With --deep: put the nodes it names on the drained list."),
    compute_fraction: float = typer.Option(
        DEFAULTS.compute_fraction, "--compute-fraction",
        help="With --deep: a node below this share of the others' median compute is named.",
    ),
    link_fraction: float = typer.Option(
        DEFAULTS.link_fraction, "--link-fraction",
        help="With --deep: a pair below this share of the other pairs' median TCP is named.",
    ),
    dcgm_level: int = typer.Option(
        DEFAULTS.dcgm_level, "--dcgm-level",
        help="With --deep, on GPU nodes with DCGM: dcgmi diag -r LEVEL (1 quick to 4 hours; 0 skips it).",
    ),
) -> None:
    """Check INVENTORY's nodes gate by gate: reachable, SSH mesh, same software, Horovod build, mpirun,
    allreduce, and on GPU nodes nvidia-smi, driver/library match and docker --gpus all."""
    from pycli.cli.options import load_inventory
    from pycli.health.options import check_options
    from pycli.health.run import check

    options = check_options(
        busbw_floor_gbps=busbw_floor, controller=controller, allreduce_size=allreduce_size, controllers=build_controllers,
        cuda_image=cuda_image, deep=deep, deep_only=deep_only, fence=fence, compute_fraction=compute_fraction,
        link_fraction=link_fraction, dcgm_level=dcgm_level,
    )
    cluster = load_inventory(inventory, inventory_option)
    raise typer.Exit(check(cluster, options, as_json=as_json))
