"""`pycli drain NODE...` and `pycli undrain NODE...`: the drained list of an inventory (pycli/cluster/drained.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli.options import INVENTORY_ONLY_OPTION


def drain_cmd(
    nodes: list[str] = typer.Argument(
        None, help="Nodes to fence off from jobs, as the inventory names them.", show_default=False
    ),
    inventory: Path | None = INVENTORY_ONLY_OPTION,
    reason: str = typer.Option(..., "--reason", "-r", help="Why, in one line; every command that leaves the node out says it."),
) -> None:
    """Fence NODEs off: train, bench and hostfile leave them out until 'pycli undrain'; provision still repairs them.

    On a cluster with Slurm, Slurm's state too: DRAIN with the reason (running jobs finish)."""
    from pycli.cli.options import load_inventory
    from pycli.cluster.drained import drain
    from pycli.cluster.slurm_state import set_drained

    cluster = load_inventory(None, inventory)
    entries = drain(cluster, nodes or [], reason)
    for entry in entries:
        print(f"drained {entry.describe()}")
    set_drained(cluster, {entry.node: entry.reason for entry in entries}, print)


def undrain_cmd(
    nodes: list[str] = typer.Argument(None, help="Drained nodes to take back.", show_default=False),
    inventory: Path | None = INVENTORY_ONLY_OPTION,
    force: bool = typer.Option(
        False, "--force", help="On a cluster with Slurm, resume a node Slurm has drained for a reason not pycli's "
                               "(an administrator's) too.",
    ),
) -> None:
    """Take drained NODEs back: jobs use them again.

    On a cluster with Slurm, Slurm's state too: RESUME where Slurm drained the node for pycli's
    reason (pycli's list, its health check, prolog or epilog); another reason is shown, and kept
    without --force (exit 1)."""
    from pycli.cli.options import load_inventory
    from pycli.cluster.drained import undrain
    from pycli.cluster.slurm_state import set_resumed
    from pycli.core.errors import EXIT_FAILED, notice

    cluster = load_inventory(None, inventory)
    ours = {entry.node: entry.reason for entry in cluster.drained}
    back, were_not = undrain(cluster, nodes or [])
    if back:
        print(f"undrained {', '.join(back)}; jobs use {'it' if len(back) == 1 else 'them'} again")
    if were_not:
        notice(f"{', '.join(were_not)} {'was' if len(were_not) == 1 else 'were'} not drained")
    # Slurm's state too, also for a node only Slurm had drained (its health check).
    if set_resumed(cluster, list(nodes or []), print, ours, force):
        raise typer.Exit(EXIT_FAILED)
