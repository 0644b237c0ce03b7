"""What the user sees of a playbook run: per-host state folded from ansible-runner events,
and how it is shown while the run goes and after it.

Kept apart from the run itself (pycli/provision/run.py), as ansible-navigator keeps its UI apart
from its runner: the run hands each event to `RunDisplay.on_event` and knows nothing of tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pycli.cluster import runner
from pycli.provision.recap import host_state


@dataclass
class HostView:
    task: str = "waiting"
    started: float | None = None
    finished: float | None = None
    result: runner.HostResult = field(default_factory=runner.HostResult)

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


# A role says something the user should read in the recap (a node left as it was, say) with a
# task so named, an `ansible.builtin.debug` whose msg is the line (run_once: said once).
RECAP_NOTE_TASK = "Recap note: "

# The live view of a large cluster (ProvisionView.summary_table): the busiest tasks, the
# failed hosts named, the slowest running hosts.
SUMMARY_TASKS = 6
SUMMARY_NAMES = 8
SUMMARY_SLOWEST = 3


class ProvisionView:
    """Per-host state of a playbook run, folded from ansible-runner events."""

    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.monotonic, end_task: str | None = None) -> None:
        self.clock = clock
        self.hosts: dict[str, HostView] = {name: HostView() for name in hosts}
        self.play = ""
        self.notes: list[str] = []  # one line per failure, unreachable host or recap note, in order
        self.end_task = end_task  # the playbook's last task: a node that reached it is through
        self.through: set[str] = set()
        self.nodes = frozenset(hosts)  # others (the controller's localhost plays) have no end to reach

    def handle(self, event: Mapping[str, object]) -> None:
        kind = str(event.get("event"))
        data = event.get("event_data") or {}
        if not isinstance(data, Mapping):
            return
        if kind == "playbook_on_play_start":
            self.play = str(data.get("play") or "")
            return
        if kind == "playbook_on_stats":
            runner.collect_host_event({name: view.result for name, view in self.hosts.items()}, event)
            return
        host = data.get("host")
        if not host:
            return
        view = self.hosts.setdefault(str(host), HostView())
        if kind == "runner_on_start":
            if view.started is None:
                view.started = self.clock()
            role = data.get("role")
            task = str(data.get("task") or "")
            view.task = f"{role} : {task}" if role and not task.startswith(f"{role} :") else task
            return
        if kind == "runner_on_ok" and self.end_task and data.get("task") == self.end_task:
            self.through.add(str(host))
        if kind == "runner_on_ok" and str(data.get("task") or "").startswith(RECAP_NOTE_TASK):
            res = data.get("res")
            said = str(res.get("msg") or "").strip() if isinstance(res, Mapping) else ""
            if said and f"note: {said}" not in self.notes:
                self.notes.append(f"note: {said}")
        before = len(view.result.messages)
        runner.collect_host_event({str(host): view.result}, event)
        if len(view.result.messages) > before:
            self.notes.append(f"{host}: {view.result.messages[-1]}")
        if view.result.unreachable:
            view.finished = view.finished or self.clock()
            view.task = "unreachable"

    def in_progress(self) -> list[str]:
        """Hosts that had started a task and not finished the play, with that task."""
        return [
            f"{name} ({view.task})"
            for name, view in self.hosts.items()
            if view.started is not None and view.finished is None and not view.result.unreachable
        ]

    def state(self, name: str) -> str:
        result = self.hosts[name].result
        through = None if self.end_task is None or name not in self.nodes else name in self.through
        return host_state(unreachable=result.unreachable, failed=bool(result.failed), through=through)

    def states(self) -> dict[str, str]:
        return {name: self.state(name) for name in self.hosts}

    def finish(self) -> None:
        now = self.clock()
        for view in self.hosts.values():
            if view.started is not None and view.finished is None:
                view.finished = now

    def table(self, live: bool, max_rows: int | None = None) -> Table:
        """A row per host; the live view past `max_rows` hosts is a summary (summary_table)."""
        now = self.clock()
        if live and max_rows is not None and len(self.hosts) > max_rows:
            return self.summary_table(now)
        title = f"play: {self.play}" if live and self.play else None
        table = Table("host", "now" if live else "result", "ok", "changed", "failed", "skipped", "elapsed", title=title)
        for name, view in self.hosts.items():
            res = view.result
            state = view.task if live else self.state(name)
            table.add_row(
                name, state, str(res.ok), str(res.changed), str(res.failed), str(res.skipped),
                f"{view.elapsed(now):.0f}s",
            )
        return table

    def summary_table(self, now: float) -> Table:
        """The live view of more hosts than a screen holds: how many hosts are at each task,
        how many wait, are through or failed, the failed and unreachable ones by name, and the
        slowest of those still running. The recap after the run stays a row per host."""
        running = {name: view for name, view in self.hosts.items()
                   if view.started is not None and view.finished is None and not view.result.unreachable
                   and not view.result.failed}
        by_task: dict[str, int] = {}
        for view in running.values():
            by_task[view.task] = by_task.get(view.task, 0) + 1
        table = Table("hosts", "now", title=f"play: {self.play}" if self.play else None)
        ranked = sorted(by_task.items(), key=lambda item: (-item[1], item[0]))
        for task, count in ranked[:SUMMARY_TASKS]:
            table.add_row(str(count), task)
        if len(ranked) > SUMMARY_TASKS:
            others = ranked[SUMMARY_TASKS:]
            table.add_row(str(sum(count for _, count in others)), f"at {len(others)} other task(s)")
        waiting = sum(1 for view in self.hosts.values() if view.started is None)
        if waiting:
            table.add_row(str(waiting), "waiting")
        for label, names in (("failed", [n for n, v in self.hosts.items() if v.result.failed and not v.result.unreachable]),
                             ("unreachable", [n for n, v in self.hosts.items() if v.result.unreachable])):
            if names:
                more = f" and {len(names) - SUMMARY_NAMES} more" if len(names) > SUMMARY_NAMES else ""
                shown = ", ".join(names[:SUMMARY_NAMES]) + more
                table.add_row(str(len(names)), f"{label}: {shown}")
        slowest = sorted(running.items(), key=lambda item: -item[1].elapsed(now))[:SUMMARY_SLOWEST]
        if slowest:
            table.add_row("", "slowest: " + ", ".join(f"{name} {view.elapsed(now):.0f}s ({view.task})" for name, view in slowest))
        return table


class RunDisplay:
    """Shows a run's view while it goes: on a terminal a live table (a summary past a screenful
    of hosts); elsewhere a line per play and per failure, as they come; with -v, only
    Ansible's own output (the runner prints it) until the recap.

    Use it as a context manager around the run and hand it every event (`on_event`).
    """

    def __init__(self, view: ProvisionView, console: Console, verbosity: int = 0) -> None:
        self.view, self.console, self.verbosity = view, console, verbosity
        self.notes_shown = 0  # the notes already printed as they came: the recap leaves them out
        self._live: Live | None = None
        self._rows = max(8, console.height - 8)  # past a screenful of hosts, the live view summarises

    def __enter__(self) -> RunDisplay:
        if not self.verbosity and self.console.is_terminal:
            self._live = Live(self.view.table(True, self._rows), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, traceback)
            self._live = None

    def on_event(self, event: Mapping[str, object]) -> None:
        play_before = self.view.play
        self.view.handle(event)
        if self._live is not None:
            self._live.update(self.view.table(True, self._rows))
            return
        if self.verbosity:
            return
        # Play names and notes are Ansible's words, printed as they are: "[nodes]" is no markup.
        if self.view.play != play_before:
            self.console.print(f"play: {self.view.play}", markup=False)
        while self.notes_shown < len(self.view.notes):
            self.console.print(f"  {self.view.notes[self.notes_shown]}", markup=False)
            self.notes_shown += 1

    def show_recap(self, with_notes: bool = True) -> None:
        """The table of every host's result, then the failures not printed yet."""
        self.console.print(self.view.table(False))
        for note in self.view.notes[self.notes_shown:] if with_notes else []:
            self.console.print(f"  {note}", markup=False)
