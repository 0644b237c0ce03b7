"""What going through Slurm's queue costs a job: the same short job started directly over SSH
and submitted through Slurm, alternately, on one inventory that has Slurm.

Prints figures, asserts nothing. For each run, from the moment `pycli train` starts:
  first output  the first line a rank printed (what a user waits for);
  total         until pycli exits (staging, the job, results fetched).
Run: .venv/bin/python benchmarks/slurm_submit.py INVENTORY [--runs 3] [--np 8]
(INVENTORY with a [slurm_controller] group, provisioned: `pycli cluster up --slurm`, then
`pycli provision`.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ["--", "--width", "8", "--image-size", "32", "--num-iters", "2", "--threads", "1"]


def one_run(inventory: Path, scheduler: str, np: int) -> tuple[float, float]:
    """(seconds to the first rank's line, seconds to the end) of one synthetic job."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pycli", "train", "-i", str(inventory), "synthetic", "--np", str(np),
                             "--scheduler", scheduler, *WORK], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = None
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if first is None and not line.startswith("pycli:"):
            first = time.monotonic() - start
    if proc.wait() != 0 or first is None:
        raise SystemExit(f"{scheduler} run failed (exit {proc.returncode}):\n" + "".join(lines[-30:]))
    return first, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--np", type=int, default=8)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {"ssh": [], "slurm": []}
    for number in range(args.runs):
        for scheduler in ("ssh", "slurm"):  # alternately, so a slower minute of the machine hits both
            figures[scheduler].append(one_run(args.inventory, scheduler, args.np))
            first, total = figures[scheduler][-1]
            print(f"run {number + 1} {scheduler:5}: first output {first:6.2f} s, total {total:6.2f} s", flush=True)
    print(f"\nsynthetic --np {args.np}, {args.runs} run(s) each; median (min-max), seconds")
    print(f"{'scheduler':10} {'first output':>22} {'total':>22}")
    for scheduler, runs in figures.items():
        cells = []
        for index in (0, 1):
            values = [run[index] for run in runs]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"{scheduler:10} {cells[0]:>22} {cells[1]:>22}")
    ssh_first = statistics.median(run[0] for run in figures["ssh"])
    slurm_first = statistics.median(run[0] for run in figures["slurm"])
    print(f"\nthrough Slurm the first output comes {slurm_first - ssh_first:+.2f} s later than started directly")


if __name__ == "__main__":
    main()
