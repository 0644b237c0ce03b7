"""Where `make test`'s time goes: one table of wall and CPU time per test and per step.

Three ways in, one file format (tab-separated, a header line, one row per entry):

- as a pytest plugin (tests/conftest.py loads it): `pytest --timings FILE` writes a row per
  test, its setup (the session fixtures a test is the first to use: the cold provisioning is
  the first integration test's setup), call and teardown apart;
- `python -m tests.timings run FILE PART NAME -- CMD...` runs a step that is not pytest (lint,
  a molecule scenario) and adds its row;
- `python -m tests.timings report DIR` reads every table of one `make test` and prints the
  largest entries and each part's sum; `--markdown` prints them as docs/timings.md's table.

CPU time is this process's and its waited-for children's (os.times()): the Ansible and pycli
processes a test starts are in it; the node containers' processes are not (Docker starts them).
Idle time is the whole machine's, in core-seconds (/proc/stat's idle and iowait, where there is
one): what an entry left idle while it ran, the cores it waited with that no part beside it
took, so an entry that waits on a poll or a timeout shows it whatever runs its work.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:  # the plugin needs pytest; the `run` and `report` commands do not
    import pytest

    _wrapper = pytest.hookimpl(wrapper=True)
except ImportError:  # pragma: no cover - only where pytest is missing
    def _wrapper(function):
        return function

COLUMNS = ("part", "entry", "outcome", "wall_s", "cpu_s", "setup_s", "call_s", "teardown_s", "idle_s")
PHASES = ("setup", "call", "teardown")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _idle() -> float | None:
    """The machine's idle core-seconds since boot (/proc/stat), or None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _idle_since(start: float | None) -> float | None:
    now = _idle()
    return None if start is None or now is None else now - start


@dataclass
class Row:
    part: str
    entry: str
    outcome: str = "passed"
    wall_s: float = 0.0
    cpu_s: float = 0.0
    setup_s: float = 0.0
    call_s: float = 0.0
    teardown_s: float = 0.0
    idle_s: float | None = None  # None: not measured (no /proc/stat, or a table written before it)

    def line(self) -> str:
        entry = " ".join(self.entry.split())  # a tab or newline in a test id would break the row
        figures = (self.wall_s, self.cpu_s, self.setup_s, self.call_s, self.teardown_s)
        idle = "" if self.idle_s is None else f"{self.idle_s:.2f}"
        return "\t".join([self.part, entry, self.outcome, *(f"{f:.2f}" for f in figures), idle])

    @classmethod
    def parse(cls, line: str) -> Row:
        part, entry, outcome, *figures = line.rstrip("\n").split("\t")
        return cls(part, entry, outcome, *(float(f) if f else None for f in figures))


def write_rows(path: Path, rows: list[Row], append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = not (append and path.exists())
    with path.open("w" if fresh else "a", encoding="utf-8") as out:
        if fresh:
            out.write("\t".join(COLUMNS) + "\n")
        for row in rows:
            out.write(row.line() + "\n")


def read_rows(folder: Path) -> list[Row]:
    rows = []
    for table in sorted(folder.glob("*.tsv")):
        lines = table.read_text(encoding="utf-8").splitlines()
        rows += [Row.parse(line) for line in lines[1:] if line.strip()]
    return rows


# ---- pytest plugin -------------------------------------------------------------------------

def pytest_addoption(parser):
    parser.addoption("--timings", metavar="FILE", default=None,
                     help="write each test's wall and CPU time (setup, call, teardown) to FILE (tests/timings.py)")
    parser.addoption("--timings-part", metavar="NAME", default=None,
                     help="the part name in the timings table (default: the file's name without .tsv)")


class _Recorder:
    def __init__(self, path: Path, part: str) -> None:
        self.path = path
        self.part = part
        self.rows: dict[str, Row] = {}

    def _phase(self, item, phase: str):
        row = self.rows.setdefault(item.nodeid, Row(self.part, item.nodeid))
        wall0, cpu0, idle0 = time.monotonic(), _cpu(), _idle()
        try:
            return (yield)
        finally:
            self._add(row, phase, time.monotonic() - wall0, _cpu() - cpu0, _idle_since(idle0))

    @staticmethod
    def _add(row: Row, phase: str, wall: float, cpu: float, idle: float | None) -> None:
        setattr(row, f"{phase}_s", getattr(row, f"{phase}_s") + wall)
        row.wall_s += wall
        row.cpu_s += cpu
        if idle is not None:
            row.idle_s = (row.idle_s or 0.0) + idle

    @_wrapper
    def pytest_runtest_setup(self, item):
        return (yield from self._phase(item, "setup"))

    @_wrapper
    def pytest_runtest_call(self, item):
        return (yield from self._phase(item, "call"))

    @_wrapper
    def pytest_runtest_teardown(self, item):
        return (yield from self._phase(item, "teardown"))

    def pytest_runtest_logreport(self, report):
        row = self.rows.get(report.nodeid)
        if row is not None and report.outcome != "passed" and row.outcome == "passed":
            row.outcome = report.outcome

    def pytest_sessionfinish(self, session):
        write_rows(self.path, list(self.rows.values()))


def pytest_configure(config):
    path = config.getoption("--timings")
    if path:
        part = config.getoption("--timings-part") or Path(path).stem
        config.pluginmanager.register(_Recorder(Path(path), part), "pycli-timings")


# ---- steps that are not pytest, and the report ---------------------------------------------

def run_step(path: Path, part: str, name: str, argv: list[str]) -> int:
    wall0, cpu0, idle0 = time.monotonic(), _cpu(), _idle()
    code = subprocess.call(argv)
    wall = time.monotonic() - wall0
    row = Row(part, name, "passed" if code == 0 else "failed", wall, _cpu() - cpu0, call_s=wall,
              idle_s=_idle_since(idle0))
    write_rows(path, [row], append=True)
    return code


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s" if seconds >= 60 else f"{seconds:.1f} s"


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _idle_text(row: Row) -> str:
    return "-" if row.idle_s is None else f"{row.idle_s:.1f}"


# The report's second list: the entries that left the machine most idle (waits no part filled).
IDLE_TOP = 5


def report(folder: Path, top: int, markdown: bool) -> str:
    rows = read_rows(folder)
    if not rows:
        return f"no timings in {folder}"
    parts: dict[str, list[Row]] = {}
    for row in rows:
        parts.setdefault(row.part, []).append(row)
    largest = sorted(rows, key=lambda r: r.wall_s, reverse=True)[:top]
    idlest = sorted((r for r in rows if r.idle_s), key=lambda r: r.idle_s, reverse=True)[:IDLE_TOP]
    if markdown:
        lines = ["| part | wall | CPU (this machine's processes) | entries |", "|---|---|---|---|"]
        lines += [f"| {part} | {_minutes(sum(r.wall_s for r in rs))} | {_minutes(sum(r.cpu_s for r in rs))} | {len(rs)} |"
                  for part, rs in parts.items()]
        lines += ["", "| largest entries | wall s | CPU s | setup s | idle core-s |", "|---|---|---|---|---|"]
        lines += [f"| {r.part}: `{_short(r.entry)}` | {r.wall_s:.1f} | {r.cpu_s:.1f} | {r.setup_s:.1f} | {_idle_text(r)} |"
                  for r in largest]
        return "\n".join(lines)
    lines = [f"timings ({folder}): the {len(largest)} largest of {len(rows)} entries",
             f"{'wall s':>8}  {'CPU s':>8}  {'setup s':>8}  {'idle':>8}  entry"]
    lines += [f"{r.wall_s:8.1f}  {r.cpu_s:8.1f}  {r.setup_s:8.1f}  {_idle_text(r):>8}  {_short(r.part + ': ' + r.entry)}"
              for r in largest]
    if idlest:
        lines.append("the machine's idle core-seconds, most first (what an entry waited with, no part beside it filling it): "
                     + ", ".join(f"{_short(r.part + ': ' + r.entry, 70)} {r.idle_s:.0f}" for r in idlest))
    lines.append("by part (molecule, lint, unit and the second venv run beside the integration tests): "
                 + ", ".join(f"{part} {_minutes(sum(r.wall_s for r in rs))}" for part, rs in parts.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.timings", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a step that is not pytest and add its row to FILE")
    run.add_argument("file", type=Path)
    run.add_argument("part")
    run.add_argument("name")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report", help="the largest entries of one make test's tables")
    rep.add_argument("folder", type=Path)
    rep.add_argument("--top", type=int, default=20)
    rep.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run needs a command after --")
        return run_step(args.file, args.part, args.name, command)
    if not args.folder.is_dir():
        print(f"python -m tests.timings: no such folder: {args.folder}", file=sys.stderr)
        return 2
    print(report(args.folder, args.top, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
