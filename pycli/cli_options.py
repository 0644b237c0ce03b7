"""What several commands' argument parsing shares: finding the inventory and reading it once.

Every command that reads an inventory takes it either way: as its first argument, or with
`-i/--inventory` (as `ansible-playbook -i` does). Both given must name the same one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import typer

from pycli.cluster_model import Cluster
from pycli.errors import BadInput

INVENTORY_HELP = "Inventory of the cluster (INI, YAML or a folder); also -i INVENTORY."
INVENTORY_OPTION = typer.Option(None, "--inventory", "-i", help="The inventory, as an option (instead of the argument).")


def given_inventory(argument: Path | None, option: Path | None) -> Path | None:
    """The inventory named as the argument or with -i; both given must name the same file or folder."""
    if argument is not None and option is not None and argument.resolve() != option.resolve():
        raise BadInput(f"two inventories given, {argument} and -i {option}; give one, as the argument or with -i")
    return argument if argument is not None else option


def required_inventory(argument: Path | None, option: Path | None) -> Path:
    """The inventory, for commands that never guess one."""
    inventory = given_inventory(argument, option)
    if inventory is None:
        raise BadInput("no inventory given; name it as the first argument or with -i INVENTORY")
    return inventory


def leading_inventory(arguments: Sequence[str], not_an_inventory: Sequence[str] = ()) -> tuple[Path | None, list[str]]:
    """An inventory given first among `train`'s or `bench`'s free arguments, and the arguments after it.

    The first argument is the inventory when it names a file or folder that exists and is
    neither a Python script (.py) nor one of `not_an_inventory` (built-in workload names).
    """
    if not arguments:
        return None, []
    first = arguments[0]
    if first.startswith("-") or first.endswith(".py") or first in not_an_inventory or not Path(first).exists():
        return None, list(arguments)
    return Path(first), list(arguments[1:])


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
    """The cluster of the inventory given (or of the one local cluster that is up), read and checked
    once, with its drained list (pycli/drained.py)."""
    from pycli.cluster_model import load_cluster
    from pycli.drained import with_drained

    return with_drained(load_cluster(resolve_inventory(inventory)))


def say_to_stderr(line: str) -> None:
    """A notice that is no part of a command's output (a hostfile on stdout stays a hostfile)."""
    print(f"pycli: {line}", file=sys.stderr)


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
