"""`pycli provision`: site.yml through the runner adapter, with a live per-host view and a recap.

The request is built by pure functions (tested without Ansible); the view folds runner
events into per-host state and renders it; `provision()` wires them to `runner.run`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from pycli import runner
from pycli.ansible_inventory import hosts_matching
from pycli.cluster_model import Cluster
from pycli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE, BadInput, read_user_text
from pycli.paths import PROJECT_ROOT, new_run_dir, runs_dir
from pycli.provision_recap import END_TASK, OK, UNREACHABLE, host_state, last_unfinished, write_recap

SITE_PLAYBOOK = PROJECT_ROOT / "playbooks" / "site.yml"
# The cache stage alone (site.yml starts with it): every download, checked, no node changed.
CACHE_PLAYBOOK = PROJECT_ROOT / "playbooks" / "cache.yml"
TAG_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # docs/tags.md; nothing a shell or Ansible could split
# Playbooks that end with the end-of-run play (pycli/provision_recap.py).
ENDS_WITH_RECAP = (SITE_PLAYBOOK,)


def parse_extra_vars(items: Sequence[str]) -> dict[str, object]:
    """The variables of `-e` options, read as `ansible-playbook -e` reads them, later ones winning.

    `key=value` gives the string as typed (`2.10` stays 2.10, never a float); `@file.yml` and an
    inline mapping (`'{"nvidia_driver_reboot": false}'`) are YAML, so they keep their types.
    Every value must survive JSON, the way ansible-runner hands variables to Ansible.
    """
    found: dict[str, object] = {}
    for item in items:
        if item.startswith("@"):
            path = Path(item[1:])
            found.update(_yaml_mapping(read_user_text(path, f"-e {item}"), f"-e {item}", str(path)))
        elif item.startswith(("{", "[")):
            found.update(_yaml_mapping(item, f"-e {item!r}", "the value"))
        else:
            key, sep, value = item.partition("=")
            if not sep or not key.isidentifier():
                raise BadInput(f"-e {item!r}: expected key=value (a variable name, '=', a value), @file.yml or a {{mapping}}")
            found[key] = value
    return found


def _yaml_mapping(text: str, label: str, what: str) -> dict[str, object]:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{label}: {what} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise BadInput(f"{label}: {what} must hold a mapping of variables")
    try:  # YAML dates become the text they were written as; what JSON cannot hold is refused
        return json.loads(json.dumps(loaded, default=_json_value))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"{label}: {exc}") from None


def _json_value(value: object) -> str:
    if isinstance(value, date):  # a datetime is a date too
        return value.isoformat()
    raise TypeError(f"a YAML {type(value).__name__} ({str(value)[:40]}) cannot be passed to Ansible; quote it")


@dataclass(frozen=True)
class ProvisionRequest:
    """What `pycli provision` and `pycli fetch` ask of a playbook run, as the CLI read it: pure data."""

    playbook: Path = SITE_PLAYBOOK
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    extra_vars: tuple[str, ...] = ()  # as given: key=value, @file.yml or {mapping}
    forks: int | None = None
    verbosity: int = 0
    offline: bool = False  # download nothing: install from the controller cache
    retry: bool = False  # only the hosts the last run of this inventory did not finish
    # Provision only these hosts (what --retry found unfinished); SSH trust still takes every node.
    hosts: tuple[str, ...] = ()


def build_request(cluster: Cluster, request: ProvisionRequest) -> runner.RunRequest:
    """The runner's request for applying `request.playbook` to the cluster's inventory."""
    if not request.playbook.is_file():
        raise BadInput(f"playbook {request.playbook} does not exist")
    for flag, tags in (("--tags", request.tags), ("--skip-tags", request.skip_tags)):
        if tags is not None and not all(TAG_NAME.fullmatch(tag) for tag in tags.split(",")):
            raise BadInput(f"{flag} {tags!r}: expected tag names separated by commas (letters, digits, _ - . :)")
    if request.limit is not None and not hosts_matching(cluster.inventory_path, request.limit):
        raise BadInput(f"--limit {request.limit!r} matches no host of {cluster.inventory_path}")
    if (request.retry or request.hosts) and request.limit is not None:
        raise BadInput("--retry picks the hosts itself (the ones the last run did not finish); leave out --limit")
    if (request.retry or request.hosts) and request.playbook not in ENDS_WITH_RECAP:
        raise BadInput(f"--retry works with {SITE_PLAYBOOK.name}, not {request.playbook.name}")
    unknown = sorted(set(request.hosts) - {host.name for host in cluster.hosts})
    if unknown:
        raise BadInput(f"{', '.join(unknown)}: not in {cluster.inventory_path}")
    offline = {"pycli_offline": True} if request.offline else {}
    only = {"pycli_hosts": ":".join(request.hosts)} if request.hosts else {}
    run_request = runner.RunRequest(
        inventory=cluster.inventory_path,
        playbook=request.playbook,
        extravars={**parse_extra_vars(request.extra_vars), **offline, **only},
        limit=request.limit,
        tags=request.tags,
        skip_tags=request.skip_tags,
        check=request.check,
        forks=request.forks,
        verbosity=request.verbosity,
    )
    return replace(run_request, forks=runner.forks_for(run_request))  # refused here, before any run folder


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


# The live view of a large cluster (ProvisionView.summary_table): the busiest tasks, the
# failed hosts named, the slowest running hosts.
SUMMARY_TASKS = 6
SUMMARY_NAMES = 8
SUMMARY_SLOWEST = 3


class ProvisionView:
    """Per-host state of a playbook run, folded from ansible-runner events."""

    def __init__(self, hosts: Sequence[str], clock=time.monotonic, end_task: str | None = None) -> None:
        self.clock = clock
        self.hosts: dict[str, HostView] = {name: HostView() for name in hosts}
        self.play = ""
        self.notes: list[str] = []  # one line per failure or unreachable host, in order
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
            table.add_row(str(sum(count for _, count in ranked[SUMMARY_TASKS:])), f"at {len(ranked) - SUMMARY_TASKS} other task(s)")
        waiting = sum(1 for view in self.hosts.values() if view.started is None)
        if waiting:
            table.add_row(str(waiting), "waiting")
        for label, names in (("failed", [n for n, v in self.hosts.items() if v.result.failed and not v.result.unreachable]),
                             ("unreachable", [n for n, v in self.hosts.items() if v.result.unreachable])):
            if names:
                shown = ", ".join(names[:SUMMARY_NAMES]) + (f" and {len(names) - SUMMARY_NAMES} more" if len(names) > SUMMARY_NAMES else "")
                table.add_row(str(len(names)), f"{label}: {shown}")
        slowest = sorted(running.items(), key=lambda item: -item[1].elapsed(now))[:SUMMARY_SLOWEST]
        if slowest:
            table.add_row("", "slowest: " + ", ".join(f"{name} {view.elapsed(now):.0f}s ({view.task})" for name, view in slowest))
        return table


def exit_code(status: str, view: ProvisionView) -> int:
    if status == "canceled":
        return EXIT_INTERRUPTED
    states = view.states().values()
    if UNREACHABLE in states:
        return EXIT_UNREACHABLE
    if status != "successful" or any(state != OK for state in states):
        return EXIT_FAILED
    return EXIT_OK


def unfinished_line(view: ProvisionView, cluster: Cluster) -> str:
    """What a failed run left, and the command that takes it up: one line."""
    left = {name: state for name, state in view.states().items() if state != OK}
    if not left or view.end_task is None:
        return ""
    named = ", ".join(f"{name} {state.lower()}" for name, state in left.items())
    return f"not finished: {named}; once fixed, 'pycli provision {cluster.inventory_path} --retry' runs on just these"



def provision(cluster: Cluster, request: ProvisionRequest, console: Console | None = None) -> int:
    """Apply the playbook to the cluster's nodes; return the exit code the design names."""
    console = console or Console(soft_wrap=True)
    verbosity = request.verbosity
    build_request(cluster, request)  # bad input is refused before the run folders are read
    if request.retry:
        last_run, unfinished = last_unfinished(cluster, runs_dir())
        if not unfinished:
            console.print(f"nothing to retry: the last provisioning of {cluster.inventory_path} ({last_run}) finished every host")
            return EXIT_OK
        request = replace(request, hosts=tuple(unfinished))
    run_request = build_request(cluster, request)
    run_dir = new_run_dir("provision")  # only once the input is known to be good
    names = [host.name for host in cluster.hosts]
    if request.limit:  # the view lists the hosts the run is about
        matched = set(hosts_matching(cluster.inventory_path, request.limit))
        names = [name for name in names if name in matched]
    end_task = END_TASK if request.playbook in ENDS_WITH_RECAP else None
    view = ProvisionView(names, end_task=end_task)
    cancel = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    doing = f"{len(request.hosts)} unfinished host(s) ({', '.join(request.hosts)})" if request.hosts else f"{len(view.hosts)} host(s)"
    forks = f"{run_request.forks} forks" if run_request.forks else f"ANSIBLE_FORKS={os.environ['ANSIBLE_FORKS']} forks"
    console.print(f"provisioning {doing} with {request.playbook.name}, {forks}; run folder {run_dir}")
    started = time.monotonic()
    shown_notes = 0
    try:
        if verbosity or not console.is_terminal:
            def on_event(event):
                nonlocal shown_notes
                play_before = view.play
                view.handle(event)
                if not verbosity and view.play != play_before:
                    console.print(f"play: {view.play}")
                while not verbosity and shown_notes < len(view.notes):
                    console.print(f"  {view.notes[shown_notes]}")
                    shown_notes += 1

            result = runner.run(run_request, run_dir, on_event=on_event, cancel=cancel.is_set)
        else:
            rows = max(8, console.height - 8)  # past a screenful of hosts, the live view summarises
            with Live(view.table(True, rows), console=console, refresh_per_second=4, transient=True) as live:
                def on_event(event):
                    view.handle(event)
                    live.update(view.table(True, rows))

                result = runner.run(run_request, run_dir, on_event=on_event, cancel=cancel.is_set)
    finally:
        signal.signal(signal.SIGINT, previous)
    code = exit_code(result.status, view)
    partial = view.in_progress()
    view.finish()
    if end_task:
        write_recap(run_dir, cluster, {name: view.state(name) for name in view.nodes})
    console.print(view.table(False))
    for note in view.notes[shown_notes:] if code != EXIT_INTERRUPTED else []:
        console.print(f"  {note}")
    took = time.monotonic() - started
    if code == EXIT_INTERRUPTED:
        console.print(
            f"cancelled after {took:.0f} s; left in the middle of a task: {', '.join(partial) or 'no host'} "
            "(a command already started there may still finish). "
            "Run the same command again to continue: the roles are idempotent"
            + (" (--retry: only the hosts it left unfinished)." if end_task else ".")
        )
    elif code == EXIT_OK:
        console.print(f"provisioned {len(cluster.hosts)} host(s) in {took:.0f} s; details in {run_dir}")
    else:
        console.print(f"provisioning failed after {took:.0f} s; full log and events in {run_dir}")
        if line := unfinished_line(view, cluster):
            console.print(line)
    return code

