"""`pycli provision INVENTORY`: every node gets the whole stack (playbooks/site.yml)."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli_options import INVENTORY_HELP, INVENTORY_OPTION, load_inventory, required_inventory
from pycli.provision import SITE_PLAYBOOK, ProvisionRequest, provision
from pycli.runner import FORKS_DEFAULT_HELP


def provision_cmd(
    inventory: Path | None = typer.Argument(None, help=INVENTORY_HELP, show_default=False),
    inventory_option: Path | None = INVENTORY_OPTION,
    limit: str | None = typer.Option(None, "--limit", "-l", help="Only these hosts (an Ansible pattern)."),
    tags: str | None = typer.Option(None, "--tags", "-t", help="Only these roles/steps (see docs/tags.md)."),
    skip_tags: str | None = typer.Option(None, "--skip-tags", help="Skip these roles/steps."),
    check: bool = typer.Option(False, "--check", help="Say what would change, change nothing."),
    extra_vars: list[str] = typer.Option([], "--extra-vars", "-e", help="key=value or @vars.yml; repeatable."),
    forks: int | None = typer.Option(None, "--forks", "-f", help=f"Hosts worked on at once (default: {FORKS_DEFAULT_HELP})."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="Show Ansible's own output (-vv, -vvv: more)."),
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
    raise typer.Exit(provision(load_inventory(required_inventory(inventory, inventory_option)), request))
