"""A job run for a measurement (`pycli check`'s allreduce gate, each run of `pycli bench`).

Its output goes to output.log in its run folder rather than the console, and when it
fails, one line of that output says why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pycli.cluster.model import Cluster
from pycli.core.errors import PycliError
from pycli.jobs.request import JobRequest
from pycli.jobs.train import run_job

_ERROR_LINE = re.compile(r"\b\w*(?:Error|Exception): ")
# Horovod's Gloo rendezvous giving up: some rank never reached it, which its own words do not say.
_RENDEZVOUS_TIMEOUT = re.compile(r"Wait timeout after (\d+) seconds for key")


def job_failure(lines: Sequence[str]) -> str:
    """The line that says why a job failed: the first exception raised, else its last words; a
    launcher's timeout with what it means."""
    for line in lines:
        if match := _RENDEZVOUS_TIMEOUT.search(line):
            return (f"{line.strip()} (not every rank reached horovodrun's rendezvous within {match.group(1)} s: a node "
                    "or a link too slow, or a port blocked between nodes; `pycli check --deep` measures each node and pair)")
    for line in lines:
        if _ERROR_LINE.search(line):
            return line.strip()
    useful = [line.strip() for line in lines if line.strip() and not line.startswith("pycli:")]
    return " | ".join(useful[-3:]) or "no output"


@dataclass(frozen=True)
class LoggedJob:
    """How a logged job ended: its exit code, its metrics records, where its output is."""

    code: int
    records: tuple[dict[str, Any], ...]
    log: Path
    refused: str = ""  # why pycli did not start it (bad input, an unreachable node), else ""

    def failure(self) -> str:
        """Why it failed, from its output ('' when it ran fine)."""
        if self.refused:
            return self.refused
        if self.code == 0:
            return ""
        return job_failure(self.log.read_text(errors="replace").splitlines())


def run_logged_job(cluster: Cluster, request: JobRequest, run_dir: Path) -> LoggedJob:
    """One `pycli.jobs.train.run_job` with its output in run_dir/output.log."""
    log = run_dir / "output.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        def write(line: str) -> None:
            handle.write(line + "\n")
            handle.flush()

        try:
            outcome = run_job(cluster, request, write=write, run_dir=run_dir)
        except PycliError as exc:
            return LoggedJob(exc.exit_code, (), log, refused=str(exc))
    return LoggedJob(outcome.code, outcome.records, log)
