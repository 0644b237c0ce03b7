"""Following one Slurm job from the controller, for `pycli train` (which submitted it) and `pycli
jobs --attach` (which follows it again): each change of its state, its output from the node that
runs its batch script, and its end, seen as Slurm says it. Over SSH to the launcher node, through
pycli.jobs.slurm's command lines.

Only an answer of Slurm's ends a watch. A connection that drops (a laptop lid, a VPN that
switches, sshd refusing new logins) is not the job's end: the watch connects again, and where it
cannot within RECONNECT_S it ends as `lost`, having touched nothing, the job going on in Slurm.
A job that can never start as asked (a QOS's per-job limit, a per-user limit it is over alone,
requeued held, a node of its fixed node list drained or down, the last two for
UNAVAILABLE_GRACE_S) is cancelled, and the watch says why.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from pycli.cluster import slurm_nodes
from pycli.cluster.model import Host
from pycli.cluster.nodes import RemoteProcess, ssh_each
from pycli.jobs import slurm
from pycli.jobs.processes import STOP_GRACE_S

# How long a watch tries to see the job again after its connection dropped, and how often.
RECONNECT_S = 30
RECONNECT_PAUSE_S = 3
# A queued job whose fixed node list holds a node Slurm will start nothing on (drained by the
# prolog's health check, down) is cancelled once the node has stayed so this long: the nodes are
# asked every NODE_CHECK_S while the job is PENDING.
UNAVAILABLE_GRACE_S = 15
NODE_CHECK_S = 5


@dataclass(frozen=True)
class Watched:
    """What a watch saw of the job by its end."""

    last: slurm.QueueState | None  # the newest state Slurm said
    held: str = ""  # the pending reason for which the watch cancelled the job: it would never start
    unavailable: str = ""  # the job's nodes that kept it from starting, as "node2 (drained: why)"
    lost: str = ""  # why the watch lost sight of the job, which goes on; empty where it saw its end
    interrupted: bool = False  # Ctrl-C came while it watched


class SlurmWatch:
    """One watch of job `job_id` from the `launcher` node; `hosts` are the nodes its output may
    come from (the batch host), `nodes` those it needs to start (checked while it is PENDING).
    `cancel_on_interrupt`: Ctrl-C cancels the job (pycli train), else it only stops the watch.
    `submitted`: the watch starts as the job is submitted, and says how long it waited to run."""

    def __init__(self, launcher: Host, hosts: Mapping[str, Host], job_dir: PurePosixPath, job_id: str,
                 write: Callable[[str], None], interrupted: threading.Event, *, nodes: Sequence[str] = (),
                 cancel_on_interrupt: bool = True, submitted: bool = True) -> None:
        self.launcher, self.hosts, self.job_dir, self.job_id = launcher, hosts, job_dir, job_id
        self.write, self.interrupted, self.nodes = write, interrupted, tuple(nodes)
        self.cancel_on_interrupt, self.submitted = cancel_on_interrupt, submitted
        self.started = time.monotonic()
        self.last: slurm.QueueState | None = None
        self.answers = 0  # lines of Slurm's the watch has had: a new connection is up once one comes
        self.gone = False
        self.held = ""
        self.unavailable = ""
        self.output: RemoteProcess | None = None
        self.output_lines = 0
        self.cancelled_at: float | None = None
        self.nodes_checked = 0.0
        self.unavailable_since: dict[str, float] = {}
        self.alone_since: float | None = None

    @property
    def output_file(self) -> PurePosixPath:
        return self.job_dir / f"slurm-{self.job_id}.out"

    def run(self) -> Watched:
        watcher = self._watcher()
        lost = ""
        while True:
            try:
                watcher.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if self._tick(watcher):
                    break
                continue
            if self.gone:
                break
            # Its SSH ended without Slurm's word that the job left the queue: the connection dropped.
            reconnected = self._reconnect(watcher.proc.returncode)
            if isinstance(reconnected, str):
                lost = reconnected
                break
            watcher = reconnected
        self._end_output()
        if not lost and self.output is None and self.last is not None:
            self._whole_output()  # it ran and ended between two looks at the queue
        return Watched(self.last, self.held, self.unavailable, lost, self.interrupted.is_set())

    def _watcher(self) -> RemoteProcess:
        return RemoteProcess(self.launcher, slurm.watch_command(self.job_id), "", self._on_watch)

    def _on_watch(self, line: str) -> None:
        if (said := slurm.unanswered(line)) is not None:
            self.answers += 1
            self.write(f"pycli: squeue on {self.launcher.name} failed ({slurm_nodes.printable(said)}); "
                       f"still watching Slurm job {self.job_id}")
            return
        if line.strip() == "@@slurm gone":
            self.gone = True
            return
        state = slurm.parse_watch_line(line)
        if state is None:
            return
        self.answers += 1
        if self.last is None or (state.state, state.reason) != (self.last.state, self.last.reason):
            note = f"; {slurm.LIMIT_NOTE}" if slurm.held_by_limit(state.reason) else ""
            why = f" ({slurm_nodes.printable(state.reason)}{note})" if state.reason not in ("None", "") else ""
            where = f" on {state.nodes}" if state.state == "RUNNING" and state.nodes else ""
            waited = f" after {time.monotonic() - self.started:.1f} s" if state.state == "RUNNING" and self.submitted else ""
            self.write(f"pycli: Slurm job {self.job_id} {state.state}{why}{where}{waited}")
        self.last = state
        if state.state == "PENDING" and not self.held:
            self.held = slurm.held_for_good(state.reason) or (state.reason if slurm.requeued_held(state.reason) else "")
        if self.output is None and state.batch_host in self.hosts and state.state in ("RUNNING", "COMPLETING"):
            self._start_output(state.batch_host)

    def _start_output(self, batch_host: str) -> None:
        def line(text: str) -> None:
            self.output_lines += 1
            self.write(text)

        command = slurm.output_command(str(self.output_file), self.job_id, from_line=self.output_lines + 1)
        self.output = RemoteProcess(self.hosts[batch_host], command, "", line)

    def _tick(self, watcher: RemoteProcess) -> bool:
        """Every half second while the watch runs: cancel what must be, follow the output again
        where its connection dropped, look at the nodes of a queued job. True: stop watching."""
        now = time.monotonic()
        if self.interrupted.is_set() and not self.cancel_on_interrupt:
            self.write(f"pycli: stopped following Slurm job {self.job_id}, which goes on in Slurm")
            watcher.kill()
            return True
        if self.cancelled_at is None and (self.held or self.unavailable or self.interrupted.is_set()):
            self.cancelled_at = now
            self.write(f"pycli: cancelling Slurm job {self.job_id} (scancel)"
                       + (": it would never start" if self.held or self.unavailable else ""))
            answer = ssh_each([(self.launcher, slurm.cancel_command(self.job_id))], shared=True)[self.launcher.name]
            if not answer.ok:
                self.write(f"pycli: scancel {self.job_id} failed: {answer.why()}")
        elif self.cancelled_at is not None and now - self.cancelled_at > STOP_GRACE_S:
            self.write(f"pycli: Slurm job {self.job_id} is still in the queue {STOP_GRACE_S} s after scancel; not waiting")
            watcher.kill()
            return True
        if (self.output is not None and self.output.proc.poll() not in (None, 0) and self.last is not None
                and self.last.state == "RUNNING" and self.last.batch_host in self.hosts):
            self._start_output(self.last.batch_host)  # its connection dropped: from the next line on
        if self.last is not None and self.last.state == "PENDING" and now - self.nodes_checked >= NODE_CHECK_S:
            self.nodes_checked = now
            if self.nodes:
                self._check_nodes(now)
            if slurm.held_by_limit(self.last.reason):
                self._check_alone(now, self.last.reason)
        return False

    def _check_alone(self, now: float, reason: str) -> None:
        """A job held by a per-user limit while no other job of its user runs is over it alone."""
        answer = ssh_each([(self.launcher, slurm.users_running_command(self.job_id))], shared=True)[self.launcher.name]
        if not answer.ok or answer.stdout.split():
            self.alone_since = None
            return
        self.alone_since = self.alone_since or now
        if now - self.alone_since >= UNAVAILABLE_GRACE_S and not self.held:
            self.held = slurm.held_for_good(reason, alone=True) or ""

    def _check_nodes(self, now: float) -> None:
        answer = ssh_each([(self.launcher, slurm_nodes.SINFO_NODES_COMMAND)], shared=True)[self.launcher.name]
        if not answer.ok:
            return  # slurmctld away for a moment: nothing is said of the nodes
        out = {node.node: node for node in slurm_nodes.unavailable(slurm_nodes.parse_sinfo_nodes(answer.stdout), self.nodes)}
        self.unavailable_since = {name: self.unavailable_since.get(name, now) for name in out}
        stuck = [out[name] for name, since in self.unavailable_since.items() if now - since >= UNAVAILABLE_GRACE_S]
        if stuck and not self.unavailable:
            self.unavailable = "; ".join(f"{node.node} ({node.state}: {slurm_nodes.printable(node.reason)})" for node in stuck)

    def _reconnect(self, code: int | None) -> RemoteProcess | str:
        """A new watch once the launcher answers again; where it does not within RECONNECT_S, why not."""
        self.write(f"pycli: lost the connection to {self.launcher.name} watching Slurm job {self.job_id} "
                   f"(ssh exit {code}); connecting again for up to {RECONNECT_S} s")
        deadline = time.monotonic() + RECONNECT_S
        while time.monotonic() < deadline and not self.interrupted.is_set():
            answers = self.answers
            watcher = self._watcher()
            while watcher.proc.poll() is None and self.answers == answers and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.answers > answers or watcher.proc.poll() is None:
                self.write(f"pycli: watching Slurm job {self.job_id} again")
                return watcher
            time.sleep(RECONNECT_PAUSE_S)
        state = self.last.state if self.last is not None else "in the queue"
        return f"lost contact with {self.launcher.name}; Slurm job {self.job_id} is still {state} as last seen"

    def _end_output(self) -> None:
        if self.output is None:
            return
        try:  # its last lines, then it ends as the job has left the queue
            self.output.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.output.kill()

    def _whole_output(self) -> None:
        hosts = list(self.hosts.values())
        answers = ssh_each([(host, f"cat {self.output_file} 2>/dev/null") for host in hosts], shared=True)
        for line in next((a.stdout for a in answers.values() if a.ok and a.stdout), "").splitlines():
            self.write(line)
