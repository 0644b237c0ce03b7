"""`pycli fetch` and `pycli cache ...`: the controller cache as a stage of its own."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli.options import (
    EXTRA_VARS_OPTION,
    INVENTORY_ARGUMENT,
    INVENTORY_OPTION,
    LIMIT_OPTION,
    VERBOSE_OPTION,
    forks_option,
    load_inventory,
    output_option,
)
from pycli.core import cache
from pycli.core.errors import BadInput, notice, renamed_line
from pycli.core.paths import cache_dir
from pycli.provision.run import CACHE_PLAYBOOK, ProvisionRequest, provision

cache_app = typer.Typer(help="The controller cache: wheelhouse locks, export and import for offline sites.",
                        no_args_is_help=True)


def _mib(count: int) -> str:
    return f"{count / 2**20:.0f} MiB"


def fetch_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    limit: str | None = LIMIT_OPTION,
    extra_vars: list[str] = EXTRA_VARS_OPTION,
    forks: int | None = forks_option(),
    verbose: int = VERBOSE_OPTION,
) -> None:
    """Fill the controller cache with everything provisioning installs (the nodes' Python and platform
    pick the wheels), each file checked; change no node."""
    request = ProvisionRequest(
        playbook=CACHE_PLAYBOOK, limit=limit, extra_vars=tuple(extra_vars), forks=forks, verbosity=verbose
    )
    raise typer.Exit(provision(load_inventory(inventory, inventory_option), request))


@cache_app.command("show")
def show_cmd() -> None:
    """Where the cache is and what it holds."""
    print(f"cache {cache_dir()}")
    for folder, files, size in cache.describe():
        print(f"  {folder:<11} {files:>4} file(s) {_mib(size):>9}")


@cache_app.command("lock")
def lock_cmd(
    python: str = typer.Option(
        ..., "--python", help="The nodes' Python, MAJOR.MINOR (Debian 12: 3.11, Ubuntu 22.04: 3.10, 24.04: 3.12)."
    ),
    arch: str = typer.Option("x86_64", "--arch", help="The nodes' architecture."),
    output: Path = output_option("Folder of locks to write into (set horovod_wheelhouse_locks to it).", cache.LOCKS_DIR),
    pip_args: list[str] = typer.Argument(None, help="More pip arguments after '--', e.g. -- --index-url URL."),
) -> None:
    """Write the wheelhouse lock for one node Python and platform from requirements.in."""
    path = cache.make_lock(python, arch, output, pip_args or [])
    pins = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    print(f"wrote {path}: {len(pins)} wheels pinned by sha256")


@cache_app.command("export")
def export_cmd(
    output: Path | None = output_option("Tar file to write.", dir_okay=False, show_default=False),
    # Before -o: the tar file as the argument (taken for one release, with a notice).
    old_file: Path | None = typer.Argument(None, hidden=True, metavar="FILE"),
) -> None:
    """Write the filled cache (downloads, wheelhouses, built artifacts) and its manifest to -o FILE."""
    if old_file is not None:
        if output is not None:
            raise BadInput(f"two tar files given, {old_file} and -o {output}; give one, with -o FILE")
        notice(renamed_line("cache export FILE", "cache export -o FILE"))
        output = old_file
    if output is None:
        raise BadInput("cache export: give the tar file to write with -o FILE")
    files, size = cache.export_cache(output)
    print(f"exported {files} file(s), {_mib(size)}, from {cache_dir()} to {output}")


@cache_app.command("import")
def import_cmd(file: Path = typer.Argument(..., help="Tar file written by 'pycli cache export'.")) -> None:
    """Check every file of FILE against its manifest, then put them into this controller's cache."""
    count = cache.import_cache(file)
    print(f"imported {count} file(s) into {cache_dir()}; 'pycli provision --offline INVENTORY' downloads nothing")
