"""`pycli provision [INVENTORY]`: every node gets the whole stack (playbooks/site.yml)."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli.options import (
    EXTRA_VARS_OPTION,
    INVENTORY_ARGUMENT,
    INVENTORY_OPTION,
    LIMIT_OPTION,
    TAGS_OPTION,
    VERBOSE_OPTION,
    forks_option,
    load_inventory,
)
from pycli.provision.run import SITE_PLAYBOOK, ProvisionRequest, provision


def provision_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    limit: str | None = LIMIT_OPTION,
    tags: str | None = TAGS_OPTION,
    skip_tags: str | None = typer.Option(None, "--skip-tags", help="Skip these roles/steps."),
    check: bool = typer.Option(False, "--check", help="Say what would change, change nothing."),
    extra_vars: list[str] = EXTRA_VARS_OPTION,
    forks: int | None = forks_option(),
    verbose: int = VERBOSE_OPTION,
    playbook: Path = typer.Option(SITE_PLAYBOOK, "--playbook", help="Another playbook of this project to apply."),
    offline: bool = typer.Option(
        False, "--offline", help="Download nothing: install from the controller cache (see 'pycli cache import')."
    ),
    retry: bool = typer.Option(
        False, "--retry", help="Only the hosts the last provisioning of INVENTORY did not finish (its run folder says)."
    ),
) -> None:
    """Install the whole stack on every node of INVENTORY, with a live per-host view."""
    request = ProvisionRequest(
        playbook=playbook, limit=limit, tags=tags, skip_tags=skip_tags, check=check, extra_vars=tuple(extra_vars),
        forks=forks, verbosity=verbose, offline=offline, retry=retry,
    )
    raise typer.Exit(provision(load_inventory(inventory, inventory_option), request))
