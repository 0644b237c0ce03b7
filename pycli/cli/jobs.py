"""`pycli jobs`: Slurm's queue and the jobs it has accounted, asked on the launcher node, else on a
controller or the next node that answers (pycli.cluster.slurm_state.ask_slurm; Slurm's clients
reach a backup slurmctld themselves); with --attach, one job pycli submitted followed again
(pycli.jobs.slurm_queue.attach)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pycli.cli.options import INVENTORY_ARGUMENT, INVENTORY_OPTION, JSON_OPTION
from pycli.cluster.model import Cluster

# Between the two answers of one SSH command; after them where sacct failed (slurmdbd not answering).
_SPLIT = "@@pycli-sacct"
_NO_ACCOUNTING = "@@pycli-no-accounting"


def jobs_cmd(
    inventory: Path | None = INVENTORY_ARGUMENT,
    inventory_option: Path | None = INVENTORY_OPTION,
    since: str = typer.Option(
        "now-1days", "--since", help="Accounted jobs since this time, as sacct -S takes it (e.g. 2026-11-26T09:00, now-7days)."
    ),
    as_json: bool = JSON_OPTION,
    attach: str | None = typer.Option(
        None, "--attach", metavar="JOB",
        help="Follow Slurm job JOB (one pycli train submitted) again: its output, its end, its results fetched. "
             "Ctrl-C stops following and leaves the job alone.",
    ),
) -> None:
    """List the cluster's Slurm queue (squeue) and its recent jobs (sacct): who, where, how long, how they ended."""
    from pycli.cli.options import load_inventory
    from pycli.cluster.slurm_state import ask_slurm
    from pycli.core.errors import BadInput, PycliError
    from pycli.core.json_documents import JOBS, versioned
    from pycli.jobs import slurm

    cluster = load_inventory(inventory, inventory_option)
    if not cluster.has_slurm:
        slurm.choose_scheduler(slurm.SLURM, False)  # the one line that says how to add Slurm
    if attach is not None:
        raise typer.Exit(_attach(cluster, attach))
    if not since.strip() or any(c.isspace() for c in since) or since.startswith("-"):
        raise BadInput(f"--since {since!r}: give one time as sacct -S takes it, e.g. now-1days or 2026-11-26T09:00")
    # The queue is slurmctld's (the primary's or the backup's); the ended jobs are slurmdbd's, on the
    # primary alone: where it does not answer, the queue is shown and the ended jobs are not.
    command = f"{slurm.squeue_command()} && echo {_SPLIT} && {{ {slurm.sacct_command(since=since)} || echo {_NO_ACCOUNTING}; }}"
    try:
        host, said = ask_slurm(cluster, command)
    except PycliError as exc:
        raise PycliError(f"asking Slurm failed: {exc}") from None
    queue_text, _, sacct_text = said.partition(_SPLIT)
    unaccounted = None
    if _NO_ACCOUNTING in sacct_text:
        unaccounted = (f"Slurm's accounting (slurmdbd, on {cluster.slurm_controller}) did not answer {host.name}: "
                       "the queue is current; the jobs that ended are listed once it answers again "
                       "(slurmctld keeps their records until then)")
        sacct_text = ""
    queue, accounted = slurm.parse_squeue(queue_text), slurm.parse_sacct(sacct_text)
    if unaccounted:
        typer.echo(f"pycli: {unaccounted}", err=True)
    if as_json:
        print(json.dumps(versioned(JOBS, {"queue": [job.as_json() for job in queue],
                                          "accounted": [job.as_json() for job in accounted],
                                          "accounting_error": unaccounted}), indent=2))
        return
    print(table(["QUEUE", "NAME", "USER", "STATE", "REASON", "NODES"],
                [[j.job_id, j.name, j.user, j.state, j.reason, j.nodes or str(j.node_count)] for j in queue]))
    print()
    print(table(["JOB", "NAME", "USER", "STATE", "EXIT", "START", "ELAPSED", "NODES"],
                [[j.job_id, j.name, j.user, j.state, f"{j.exit_code}:{j.signal}", j.start, j.elapsed, j.nodes]
                 for j in accounted]))


def _attach(cluster: Cluster, job_id: str) -> int:
    from pycli.core.paths import new_run_dir
    from pycli.jobs.slurm_queue import attach

    results = new_run_dir("attach") / "results"
    ended = attach(cluster, job_id, results)
    if ended.detached:
        print(f"pycli: {ended.why}" + (f": follow it with 'pycli jobs {cluster.inventory_path} --attach {job_id}'"
                                       if ended.lost else ""))
        return ended.code
    said = "finished" if ended.code == 0 else f"failed (exit {ended.code})"
    print(f"pycli: {ended.why}; job {said}; results in {results}")
    return ended.code


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [" ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)
