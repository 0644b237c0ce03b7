"""What several commands' argument parsing shares: finding the inventory and reading it once."""

from __future__ import annotations

from pathlib import Path

from pycli.cluster_model import Cluster
from pycli.errors import BadInput


def resolve_inventory(inventory: Path | None) -> Path:
    """The inventory given, else the one local cluster that is up."""
    if inventory is not None:
        return inventory
    from pycli import local_cluster

    running = local_cluster.running_clusters()
    if len(running) == 1:
        return next(iter(running.values()))
    if not running:
        raise BadInput("no inventory given and no local cluster is up: pass -i INVENTORY, or run 'pycli cluster up'")
    raise BadInput(f"no inventory given and {len(running)} local clusters are up ({', '.join(sorted(running))}): pass -i INVENTORY")


def load_inventory(inventory: Path | None) -> Cluster:
    """The cluster of the inventory given (or of the one local cluster that is up), read and checked once."""
    from pycli.cluster_model import load_cluster

    return load_cluster(resolve_inventory(inventory))


def controller_option(controller: str | None, backend: str | None, *, default: str = "gloo") -> str:
    """horovodrun's controller from --controller, or from --backend, its older name (still accepted).

    Checked under the name the user typed, so the error names the option on their command line.
    """
    from pycli.launch_lines import HOROVOD_CONTROLLERS

    for option, value in (("--controller", controller), ("--backend", backend)):
        if value is not None and value not in HOROVOD_CONTROLLERS:
            raise BadInput(f"unknown {option} {value!r}; use one of {', '.join(HOROVOD_CONTROLLERS)}")
    if controller is not None and backend is not None and controller != backend:
        raise BadInput(f"--controller {controller} and --backend {backend} disagree; give only --controller")
    return controller or backend or default
