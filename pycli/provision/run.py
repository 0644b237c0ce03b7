"""`pycli provision`: site.yml through the runner adapter, with a live per-host view and a recap.

The request is built by pure functions (tested without Ansible), `-e` read by
pycli/provision/extra_vars.py; what the user sees of the run is pycli/provision/view.py;
`provision()` wires them to `runner.run`.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from pycli.cluster import runner
from pycli.cluster.ansible_inventory import hosts_matching
from pycli.cluster.model import Cluster
from pycli.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE, BadInput
from pycli.core.paths import new_run_dir, runs_dir
from pycli.core.tree import PROJECT_ROOT
from pycli.provision.extra_vars import parse_extra_vars
from pycli.provision.recap import END_TASK, OK, UNREACHABLE, last_unfinished, write_recap
from pycli.provision.view import ProvisionView, RunDisplay

SITE_PLAYBOOK = PROJECT_ROOT / "playbooks" / "site.yml"
# The cache stage alone (site.yml starts with it): every download, checked, no node changed.
CACHE_PLAYBOOK = PROJECT_ROOT / "playbooks" / "cache.yml"
TAG_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # docs/tags.md; nothing a shell or Ansible could split
# Playbooks that end with the end-of-run play (pycli/provision/recap.py).
ENDS_WITH_RECAP = (SITE_PLAYBOOK,)


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
        many_tasks=True,
    )
    return replace(run_request, forks=runner.forks_for(run_request))  # refused here, before any run folder


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


def ran_slurm(request: ProvisionRequest) -> bool:
    """The run went through the slurm role (site.yml, its tag not left out)."""
    return ((request.tags is None or "slurm" in request.tags.split(","))
            and "slurm" not in (request.skip_tags or "").split(",") and request.playbook in ENDS_WITH_RECAP)


def stale_slurm_line(view: ProvisionView, cluster: Cluster, request: ProvisionRequest) -> str:
    """Where a run through the slurm role did not finish on some nodes, they keep the slurm.conf
    they had while the others have the new one: one line that says so, and what mends it."""
    left = [name for name, state in view.states().items() if state != OK]
    if not cluster.has_slurm or not left or not ran_slurm(request) or request.check:
        return ""
    one = len(left) == 1
    return (f"Slurm: {', '.join(left)} {'keeps' if one else 'keep'} the slurm.conf {'it' if one else 'they'} had, unlike "
            f"the other nodes; run 'pycli provision {cluster.inventory_path} --tags slurm --retry' once "
            f"{'it answers' if one else 'they answer'}")


def drain_again(cluster: Cluster, request: ProvisionRequest, view: ProvisionView, say: Callable[[str], None]) -> None:
    """pycli's drained list, set in Slurm again once a run has been through the slurm role on the
    controller: whatever Slurm lost of it (a node it forgot, a state file gone), the list stands;
    a node Slurm has drained already keeps Slurm's reason."""
    from pycli.cluster.slurm_state import set_drained

    controller = cluster.slurm_controller
    if (not cluster.drained or not ran_slurm(request) or request.check or controller not in view.hosts
            or view.state(controller) != OK):
        return
    set_drained(cluster, {entry.node: entry.reason for entry in cluster.drained}, say,
                said="pycli's drained list, set again after provisioning", keep_slurms=True)


def provision(cluster: Cluster, request: ProvisionRequest, console: Console | None = None) -> int:
    """Apply the playbook to the cluster's nodes; return the exit code the design names."""
    console = console or Console(soft_wrap=True, markup=False)  # paths, task names and messages as they are
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
    doing = (f"{len(request.hosts)} unfinished host(s) ({', '.join(request.hosts)})" if request.hosts
             else f"{len(view.hosts)} host(s)")
    forks = f"{run_request.forks} forks" if run_request.forks else f"ANSIBLE_FORKS={os.environ['ANSIBLE_FORKS']} forks"
    console.print(f"provisioning {doing} with {request.playbook.name}, {forks}; run folder {run_dir}")
    started = time.monotonic()
    display = RunDisplay(view, console, request.verbosity)
    try:
        with display:
            result = runner.run(run_request, run_dir, on_event=display.on_event, cancel=cancel.is_set)
    finally:
        signal.signal(signal.SIGINT, previous)
    code = exit_code(result.status, view)
    partial = view.in_progress()
    view.finish()
    if end_task:
        write_recap(run_dir, cluster, {name: view.state(name) for name in view.nodes})
    display.show_recap(with_notes=code != EXIT_INTERRUPTED)
    if code != EXIT_INTERRUPTED:
        drain_again(cluster, request, view, console.print)
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
        for line in (unfinished_line(view, cluster), stale_slurm_line(view, cluster, request)):
            if line:
                console.print(line)
    return code

