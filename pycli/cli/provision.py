"""`pycli provision [INVENTORY]`: every node gets the whole stack (playbooks/site.yml); with --batch,
a change rolled over the nodes a few at a time (pycli/provision/rolling.py)."""

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
from pycli.core.errors import BadInput
from pycli.provision.rolling import DEFAULT_JOB_WAIT_S, RollingRequest, check_request, roll
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
    batch: int | None = typer.Option(
        None, "--batch", metavar="N",
        help="Roll the change over the nodes N at a time, idle ones first: drain, wait for their jobs, apply, "
             "run the node gate, resume. A node that fails stays drained and the roll stops.",
    ),
    job_wait: float = typer.Option(
        DEFAULT_JOB_WAIT_S, "--job-wait", metavar="SECONDS",
        help="With --batch: how long a batch waits for its jobs to end; then the roll stops and names them.",
    ),
    cancel_jobs: bool = typer.Option(
        False, "--cancel-jobs", help="With --batch: cancel the jobs still running on a batch after --job-wait, and go on."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="With --batch: print the batches, the jobs each waits for and what would change; do nothing."
    ),
) -> None:
    """Install the whole stack on every node of INVENTORY, with a live per-host view; with --batch, a
    rolling change while jobs run."""
    request = ProvisionRequest(
        playbook=playbook, limit=limit, tags=tags, skip_tags=skip_tags, check=check, extra_vars=tuple(extra_vars),
        forks=forks, verbosity=verbose, offline=offline, retry=retry,
    )
    if batch is None:
        asked = [flag for flag, given in (("--job-wait", job_wait != DEFAULT_JOB_WAIT_S), ("--cancel-jobs", cancel_jobs),
                                          ("--dry-run", dry_run)) if given]
        if asked:
            raise BadInput(f"{', '.join(asked)} belong(s) to a rolling change: add --batch N")
        raise typer.Exit(provision(load_inventory(inventory, inventory_option), request))
    rolling = RollingRequest(batch=batch, job_wait_s=job_wait, cancel_jobs=cancel_jobs, dry_run=dry_run)
    check_request(request)
    raise typer.Exit(roll(load_inventory(inventory, inventory_option), request, rolling))
