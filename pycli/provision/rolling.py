"""`pycli provision INVENTORY --batch N`: a change rolled over the cluster N nodes at a time.

Batch by batch: the batch is drained (pycli's drained list, and Slurm's DRAIN where the cluster
has Slurm) with a reason that says so; pycli waits until the jobs on it have ended (at most
`job_wait_s`: then it stops and names the jobs, or with `cancel_jobs` cancels them); the playbook
is applied to the batch alone; the node gate runs on each of its nodes; those that pass are
resumed, and on a Slurm cluster the next batch starts once Slurm hears from them again (a resumed
node is "not responding" until its slurmd answers, and gets no job till then). A node that fails
its provisioning or its gate, or whose slurmd never answers, stays drained, with the reason, and
the roll stops there. Idle nodes go first, and never more than N nodes are out of service at once
(nodes drained before the roll, for a reason of someone else's, stay drained and count as theirs).
Where the run goes through the slurm role, Slurm's own daemons on the controller are changed
first, without a drain (slurmdbd, then slurmctld: jobs survive both restarts), then the nodes.

The gate: on a Slurm cluster, the HealthCheckProgram Slurm itself runs (pycli's node gate: the
GPU probe, free disk, munge); elsewhere, the same GPU probe (pycli_node.gpu_probe). Without Slurm,
a node's jobs are the processes that name a job folder under the nodes' work folder.

The plan (the batches and the jobs each waits for) is pure (plan_batches), as are the parsers;
`roll()` wires them to Slurm, SSH and `provision()`.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rich.console import Console

from pycli.cluster import drained as drained_list
from pycli.cluster.ansible_inventory import hosts_matching
from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import ssh_each
from pycli.cluster.slurm_nodes import NodeState, drain_command, expand_hostlist, printable
from pycli.cluster.slurm_state import ask_slurm, node_states, set_drained, set_resumed
from pycli.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, BadInput, PycliError
from pycli.jobs.launch import NodeLayout, job_process_pattern, stray_sweep_line
from pycli.jobs.slurm import parse_squeue, squeue_command
from pycli.provision.run import ProvisionRequest, provision, ran_slurm
from pycli_node.gpu_probe import evaluate_node, health_command, split_sections

ROLLING_REASON = "pycli rolling change"  # the drain reason's start: "pycli rolling change: batch 2 of 3"
DEFAULT_JOB_WAIT_S = 3600
POLL_S = 10.0
# Slurm's HealthCheckProgram as slurmctld has it, run as Slurm runs it; nothing when none is set.
HEALTH_PROGRAM_COMMAND = (
    "p=$(scontrol show config | sed -n 's/^HealthCheckProgram *= *//p'); "
    'if [ -z "$p" ] || [ "$p" = "(null)" ]; then echo "no HealthCheckProgram in slurm.conf"; exit 0; fi; exec "$p"'
)
# How long a resumed node's slurmd gets to answer slurmctld, and after how long it is restarted once.
SLURMD_ANSWER_WAIT_S = 120.0
SLURMD_NUDGE_S = 20.0
RESTART_SLURMD = "systemctl restart slurmd"
JOB_FOLDER = r"([0-9]{8}-[0-9]{6}-[0-9]+)"  # a job folder's name, as pycli names jobs (stage-job.sh)


@dataclass(frozen=True)
class RollingRequest:
    """How `--batch` rolls a change: pure data, as the CLI read it."""

    batch: int
    job_wait_s: float = DEFAULT_JOB_WAIT_S
    cancel_jobs: bool = False
    dry_run: bool = False
    poll_s: float = POLL_S

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise BadInput(f"--batch {self.batch}: give how many nodes may be out of service at once, 1 or more")
        if self.job_wait_s < 0:
            raise BadInput(f"--job-wait {self.job_wait_s:g}: give the seconds a batch waits for its jobs, 0 or more")


def check_request(request: ProvisionRequest) -> None:
    """What a rolling run cannot be asked together with."""
    if request.check:
        raise BadInput("--batch rolls a change over the nodes; --check changes nothing: use --batch N --dry-run")
    if request.retry:
        raise BadInput("--retry takes up a provisioning that did not finish; --batch rolls a new one: use one of them")


def plan_batches(names: Sequence[str], jobs: Mapping[str, Sequence[str]], size: int) -> list[tuple[str, ...]]:
    """`names` in batches of `size`: the nodes without jobs first, then those with, each in the order given."""
    ordered = [name for name in names if not jobs.get(name)] + [name for name in names if jobs.get(name)]
    return [tuple(ordered[start:start + size]) for start in range(0, len(ordered), size)]


def parse_slurm_jobs(stdout: str, nodes: Sequence[str]) -> dict[str, list[str]]:
    """node -> "JOB (USER)" of each job Slurm runs there (or still cleans up after), from squeue_command()."""
    found: dict[str, list[str]] = {node: [] for node in nodes}
    for job in parse_squeue(stdout):
        if job.state == "PENDING":
            continue
        for node in expand_hostlist(job.nodes):
            if node in found:
                found[node].append(f"{job.job_id} ({printable(job.user)})")
    return found


def parse_job_processes(stdout: str, jobs_dir: str) -> list[str]:
    """The job ids whose folders under `jobs_dir` the processes of `pgrep -af` name, in order."""
    ids: list[str] = []
    for found in re.findall(re.escape(jobs_dir.rstrip("/")) + "/" + JOB_FOLDER + r"(?:[/ ]|$)", stdout, flags=re.M):
        if found not in ids:
            ids.append(found)
    return ids


def jobs_command(layout: NodeLayout) -> str:
    """The processes of every pycli job on a node (their command lines name the job's folder)."""
    return f"pgrep -af {shlex.quote(job_process_pattern(layout.jobs_dir))} || true"


def gate_line(node: str, answer_ok: bool, stdout: str, why: str) -> tuple[bool, str]:
    """(passed, one line) of the node gate's answer (HEALTH_PROGRAM_COMMAND): its last line. A gate
    that finds the node drained already (by the roll) says so after its reason: that part is cut."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    line = lines[-1] if lines else why
    line = line.split(" (drained already: ", 1)[0]
    return answer_ok, printable(line)


def probe_line(node: str, answer_ok: bool, stdout: str, why: str) -> tuple[bool, str]:
    """(passed, one line) of the GPU probe's answer (pycli_node.gpu_probe.health_command), on a
    node without Slurm's gate: a node without nvidia-smi passes."""
    if not answer_ok:
        return False, f"the GPU probe did not run ({why})"
    found = evaluate_node(node, split_sections(stdout), 0)
    if found is None:
        return True, "no NVIDIA GPU"
    if found.problems:
        return False, "; ".join(found.problems)
    return True, f"{len(found.gpus)} GPU(s) healthy"


def silent_nodes(states: Mapping[str, NodeState], nodes: Sequence[str]) -> dict[str, str]:
    """node -> its sinfo state, of `nodes` whose slurmd slurmctld does not hear from (NodeState.answering)."""
    return {node: states[node].state if node in states else "not in sinfo"
            for node in nodes if node not in states or not states[node].answering}


class _Stop(Exception):
    """The roll stops: its exit code and what is said."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code, self.line = code, line


class _Roll:
    """One rolling run over a loaded cluster: what it drained, so that it gives back exactly that."""

    def __init__(self, cluster: Cluster, request: ProvisionRequest, rolling: RollingRequest, console: Console) -> None:
        self.cluster, self.request, self.rolling, self.console = cluster, request, rolling, console
        self.layout = NodeLayout.from_settings(cluster.settings)
        self.ours: dict[str, str] = {}  # node -> the reason the roll drained it with, while it is drained

    def say(self, line: str) -> None:
        self.console.print(f"roll: {line}")

    def host(self, name: str) -> Host:
        return next(host for host in self.cluster.hosts if host.name == name)

    # --- what runs where ---------------------------------------------------------------------

    def jobs(self, nodes: Sequence[str]) -> dict[str, list[str]]:
        """node -> its jobs now: Slurm's, or without Slurm the processes of pycli's jobs."""
        if self.cluster.has_slurm:
            try:
                return parse_slurm_jobs(ask_slurm(self.cluster, squeue_command())[1], nodes)
            except PycliError as exc:
                raise _Stop(EXIT_FAILED, f"cannot tell which jobs run on {', '.join(nodes)}: {exc}") from None
        answers = ssh_each([(self.host(node), jobs_command(self.layout)) for node in nodes], shared=True)
        found = {}
        for node in nodes:
            answer = answers[node]
            if not answer.ok:
                raise _Stop(EXIT_FAILED, f"cannot tell which jobs run on {node}: {answer.why()}")
            found[node] = parse_job_processes(answer.stdout, str(self.layout.jobs_dir))
        return found

    def cancel(self, jobs: Mapping[str, Sequence[str]]) -> None:
        ids = sorted({label.split(" ")[0] for labels in jobs.values() for label in labels})
        if self.cluster.has_slurm:
            try:
                ask_slurm(self.cluster, "scancel " + " ".join(shlex.quote(job) for job in ids))
            except PycliError as exc:
                raise _Stop(EXIT_FAILED, f"cancelling jobs {', '.join(ids)} failed: {exc}") from None
        else:
            commands = [(self.host(node), " ; ".join(f"( {stray_sweep_line(self.layout.jobs_dir / job)} )" for job in labels))
                        for node, labels in jobs.items() if labels]
            answers = ssh_each(commands, shared=True)
            left = [name for name, answer in answers.items() if not answer.ok]
            if left:
                raise _Stop(EXIT_FAILED, f"the jobs on {', '.join(left)} did not all stop: "
                                         + "; ".join(answers[name].why() for name in left))
        self.say(f"cancelled job(s) {', '.join(ids)} (--cancel-jobs)")

    def gate(self, nodes: Sequence[str]) -> dict[str, tuple[bool, str]]:
        """node -> (passed, its gate's line)."""
        slurm_gate = self.cluster.has_slurm and self.cluster.slurm_node_gate
        command = HEALTH_PROGRAM_COMMAND if slurm_gate else health_command(0)
        read = gate_line if slurm_gate else probe_line
        answers = ssh_each([(self.host(node), command) for node in nodes], timeout_s=300, shared=True)
        return {node: read(node, answers[node].ok, answers[node].stdout, answers[node].why()) for node in nodes}

    def silent_slurmds(self, nodes: Sequence[str]) -> dict[str, str]:
        """The resumed `nodes` back in service: Slurm flags a resumed node not responding ("idle*")
        until its slurmd answers the ping the resume sends, and starts no job there until then. Each
        gets up to SLURMD_ANSWER_WAIT_S; one still silent after SLURMD_NUDGE_S (a ping lost to the
        change, a slurmd the change stopped) gets its slurmd restarted, which registers at once (its
        jobs ended before the change). node -> why, of those that never answer."""
        if not self.cluster.has_slurm or not nodes:
            return {}
        started, restarted = time.monotonic(), False
        while True:
            try:
                states = node_states(self.cluster)
            except PycliError as exc:
                return {node: str(exc) for node in nodes}
            silent = silent_nodes(states, nodes)
            if not silent:
                return {}
            waited = time.monotonic() - started
            if waited >= SLURMD_ANSWER_WAIT_S:
                return {node: f"slurmctld hears nothing from its slurmd ({state}) {waited:.0f} s after the change"
                        for node, state in silent.items()}
            if not restarted and waited >= SLURMD_NUDGE_S:
                self.say(f"Slurm hears nothing from the slurmd of {', '.join(f'{n} ({s})' for n, s in silent.items())} "
                         f"after {waited:.0f} s: restarting it there (no job left on it)")
                answers = ssh_each([(self.host(node), RESTART_SLURMD) for node in silent], shared=True)
                failed = {node: f"restarting its slurmd failed: {answers[node].why()}"
                          for node in silent if not answers[node].ok}
                if failed:
                    return failed
                restarted = True
            time.sleep(1)

    # --- draining ------------------------------------------------------------------------------

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        """Drain those of `nodes` nobody has drained: pycli's list, then Slurm's state (its own drains kept)."""
        theirs = {entry.node for entry in self.cluster.drained if entry.node not in self.ours}
        mine = [node for node in nodes if node not in theirs]
        for node in sorted(theirs & set(nodes)):
            self.say(f"{node} is drained already ({printable(self._reason_of(node))}): it stays so after the roll")
        if not mine:
            return
        drained_list.drain(self.cluster, mine, reason)
        self.ours.update({node: reason for node in mine})
        self.cluster = drained_list.with_drained(self.cluster)
        set_drained(self.cluster, {node: reason for node in mine}, self.say,
                    said="the roll's; running jobs finish, no new one starts there", keep_slurms=True)

    def _reason_of(self, node: str) -> str:
        return next((entry.reason for entry in self.cluster.drained if entry.node == node), "")

    def mark(self, node: str, reason: str) -> None:
        """A node that failed: it stays drained, with `reason` in pycli's list and in Slurm."""
        drained_list.drain(self.cluster, [node], reason[:drained_list.MAX_REASON])
        self.cluster = drained_list.with_drained(self.cluster)
        self.ours.pop(node, None)
        if self.cluster.has_slurm:
            ask_slurm(self.cluster, drain_command([node], reason[:drained_list.MAX_REASON]))

    def resume(self, nodes: Sequence[str]) -> None:
        back = [node for node in nodes if node in self.ours]
        if not back:
            return
        reasons = {node: self.ours.pop(node) for node in back}
        drained_list.undrain(self.cluster, back)
        self.cluster = drained_list.with_drained(self.cluster)
        set_resumed(self.cluster, back, self.say, reasons)

    # --- the roll ------------------------------------------------------------------------------

    def wait_for_jobs(self, batch: Sequence[str]) -> None:
        started, said = time.monotonic(), None
        while True:
            jobs = {node: labels for node, labels in self.jobs(batch).items() if labels}
            if not jobs:
                if said:
                    self.say(f"the jobs on {', '.join(batch)} have ended ({time.monotonic() - started:.0f} s)")
                return
            named = "; ".join(f"{node}: {', '.join(labels)}" for node, labels in jobs.items())
            if named != said:
                self.say(f"waiting for job(s) to end (at most {self.rolling.job_wait_s:g} s): {named}")
                said = named
            if time.monotonic() - started >= self.rolling.job_wait_s:
                if self.rolling.cancel_jobs:
                    self.cancel(jobs)
                    started = time.monotonic()  # the cancelled jobs get the same time to end
                    continue
                raise _Stop(EXIT_FAILED, f"{named} still running after {self.rolling.job_wait_s:g} s (--job-wait): "
                                         "nothing changed there; run again later, or with --cancel-jobs")
            time.sleep(self.rolling.poll_s)

    def controller_first(self) -> None:
        """Slurm's daemons on the controllers before any node: slurmdbd, then slurmctld on the
        primary and its backup (the role's handlers' order); jobs survive both restarts, so nothing
        is drained for it."""
        controllers = ", ".join(self.cluster.slurm_controllers)
        what = "controllers" if self.cluster.slurm_backup else "controller"
        self.say(f"Slurm's daemons on the {what} {controllers} first (jobs survive their restart)")
        code = provision(self.cluster, replace(self.request, limit=",".join(self.cluster.slurm_controllers), tags="slurm"),
                         self.console)
        if code != EXIT_OK:
            raise _Stop(code, f"the slurm role failed on the {what} {controllers}: no node was changed")

    def batch(self, index: int, count: int, batch: Sequence[str]) -> None:
        reason = f"{ROLLING_REASON}: batch {index} of {count}"
        self.say(f"batch {index} of {count}: {', '.join(batch)}")
        self.drain(batch, reason)
        try:
            self.wait_for_jobs(batch)
        except _Stop:
            self.resume(batch)  # nothing changed there: the batch goes back to its jobs
            raise
        code = provision(self.cluster, replace(self.request, limit=",".join(batch)), self.console)
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if code != EXIT_OK:
            for node in batch:
                if node in self.ours:
                    self.mark(node, f"{ROLLING_REASON}: its provisioning failed (exit {code})")
            raise _Stop(code, f"batch {index} of {count} ({', '.join(batch)}) failed to provision: it stays drained; "
                              "the nodes after it were not changed")
        results = self.gate(batch)
        failed = {node: line for node, (ok, line) in results.items() if not ok}
        for node, (ok, line) in results.items():
            self.say(f"{node} gate: {'passed' if ok else 'FAILED'}: {line}")
        passed = [node for node in batch if node not in failed]
        self.resume(passed)
        for node, line in failed.items():
            self.mark(node, line)
        if failed:
            raise _Stop(EXIT_FAILED, f"{', '.join(failed)} failed the gate after the change and stay(s) drained with "
                                     "its reason; the nodes after this batch were not changed")
        silent = self.silent_slurmds(passed)
        for node, line in silent.items():
            self.say(f"{node}: {line}: drained again")
            self.mark(node, f"{ROLLING_REASON}: {line}")
        if silent:
            raise _Stop(EXIT_FAILED, f"{', '.join(silent)} passed the gate but Slurm does not hear from it: it stays "
                                     "drained; the nodes after this batch were not changed")

    def run(self) -> int:
        names = [host.name for host in self.cluster.hosts]
        if self.request.limit:
            matched = set(hosts_matching(self.cluster.inventory_path, self.request.limit))
            names = [name for name in names if name in matched]
        slurm_first = self.cluster.has_slurm and ran_slurm(self.request)
        jobs = self.jobs(names)
        batches = plan_batches(names, jobs, self.rolling.batch)
        self.say(f"{len(names)} node(s), {self.rolling.batch} at a time, idle first"
                 + ("; Slurm's daemons on the controller first" if slurm_first else ""))
        for index, batch in enumerate(batches, 1):
            waits = "; ".join(f"{node}: job(s) {', '.join(jobs[node])}" for node in batch if jobs.get(node))
            self.say(f"batch {index} of {len(batches)}: {', '.join(batch)}" + (f" (waits for {waits})" if waits else " (idle)"))
        if self.rolling.dry_run:
            self.say("--dry-run: what would change on them (Ansible's check mode), and nothing else done")
            return provision(self.cluster, replace(self.request, limit=",".join(names), check=True), self.console)
        started = time.monotonic()
        if slurm_first:
            self.controller_first()
        for index, batch in enumerate(batches, 1):
            self.batch(index, len(batches), batch)
        self.say(f"done: {len(names)} node(s) changed in {len(batches)} batch(es) in {time.monotonic() - started:.0f} s")
        return EXIT_OK


def roll(cluster: Cluster, request: ProvisionRequest, rolling: RollingRequest, console: Console | None = None) -> int:
    """Roll `request` over the cluster's nodes, `rolling.batch` at a time; the exit code."""
    check_request(request)
    console = console or Console(soft_wrap=True, markup=False)
    run = _Roll(cluster, request, rolling, console)
    try:
        return run.run()
    except _Stop as stop:
        run.say(stop.line)
        return stop.code
    except KeyboardInterrupt:
        held = ", ".join(run.ours) or "no node"
        run.say(f"interrupted; drained by the roll and left so: {held} (pycli undrain NODE... takes them back once you are sure)")
        return EXIT_INTERRUPTED
