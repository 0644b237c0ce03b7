"""How a workload's own input errors end: one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path


class WorkloadError(Exception):
    """A problem with the workload's input, reported as one line by `run()`."""


def run(main) -> None:
    """Run a workload's main(); its own input errors end as one line and exit code 2."""
    try:
        main()
    except WorkloadError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
