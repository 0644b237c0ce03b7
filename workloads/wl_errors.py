"""How a workload's own input errors end: one line on stderr and exit code 2."""

from __future__ import annotations

import gc
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
        _let_go_of_the_process_group()
        sys.exit(2)


def _let_go_of_the_process_group() -> None:
    """Free DDP's reducer (a reference cycle holding Gloo work) and this rank's process group
    while the interpreter is whole: left to the exit, they can abort the process (SIGABRT,
    "terminate called without an active exception") instead of exit 2. Local to this rank: no
    collective, so a rank that failed alone does not wait for the others."""
    gc.collect()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
