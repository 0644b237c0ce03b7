"""A job's processes on its nodes: started over SSH (on a local host, here: pycli.cluster.nodes.node_argv),
their output streamed, Ctrl-C forwarded, all stopped when one fails or the time limit passes,
and how the job ended said in words."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pycli.cluster.nodes import SSH_FAILED, RemoteProcess, connection_lost
from pycli.core.errors import EXIT_FAILED, EXIT_INTERRUPTED
from pycli.jobs.launch import JobPlan, launch_commands
from pycli.jobs.rank_exit import RankExitReader


@dataclass(frozen=True)
class JobExit:
    """How the job's processes ended: the exit code, and which host ended it first and how."""

    code: int
    why: str = ""  # e.g. "node2 exited 1 first", "node2 stopped answering", "its --time-limit of 60 s passed"
    timed_out: bool = False  # pycli stopped it: its time limit passed
    lost: bool = False  # a node's SSH session ended with ssh's own error: the node stopped answering
    final: bool = False  # no restart would do better: Slurm would never start the job as asked
    detached: bool = False  # pycli lost sight of a job that goes on in Slurm: nothing of it may be touched


# How long the job's processes get to end on Ctrl-C, once pycli stops them itself.
STOP_GRACE_S = 30


def run_processes(plan: JobPlan, write: Callable[[str], None] = print, time_limit_s: float | None = None) -> JobExit:
    """Start the job's processes, stream their output, forward Ctrl-C, stop them all when one
    fails or the time limit passes; say how the job ended."""
    commands = launch_commands(plan)
    many = len(commands) > 1
    ranks = RankExitReader(plan.hosts)

    def show(line: str) -> None:
        ranks.feed(line)
        write(line)

    processes: list[RemoteProcess] = []  # started once pycli's Ctrl-C handler is in place
    hosts = [host.name for host, _ in commands]
    user_interrupt = threading.Event()
    stopping = threading.Event()
    first: list[JobExit] = []  # what ended the job, as pycli saw it first
    deadline = time.monotonic() + time_limit_s if time_limit_s else None

    stop_asked: list[float] = []

    def stop_all() -> None:
        stopping.set()
        stop_asked.append(time.monotonic())
        for proc in processes:
            proc.interrupt()

    def on_sigint(*_: object) -> None:
        if user_interrupt.is_set():
            for proc in processes:
                proc.kill()
            return
        user_interrupt.set()
        write("pycli: interrupting the job on every node (Ctrl-C again to stop waiting)")
        stop_all()

    def failed(index: int) -> JobExit | None:
        name, code = hosts[index], processes[index].proc.poll()
        if connection_lost(processes[index].host, code):
            return JobExit(SSH_FAILED, f"{name} stopped answering (ssh exit {SSH_FAILED})", lost=True)
        if code not in (None, 0):
            return JobExit(code, f"{name} exited {code} first" if many else f"exit {code} on {name}")
        return None

    def failed_first() -> JobExit | None:
        return next((found for i in range(len(processes)) if (found := failed(i)) is not None), None)

    # torchrun --elastic: the agents left go on without a node that failed or was lost; the
    # job is what the agent on the first node (the rendezvous host) ends with.
    carry_on = plan.restarts_by_agents
    left_behind: set[int] = set()

    def one_failed() -> JobExit | None:
        """The failure that ends the job, if any; under torchrun --elastic, say each node left behind."""
        if not carry_on:
            return failed_first()
        for i in range(1, len(processes)):
            if i not in left_behind and (found := failed(i)) is not None:
                left_behind.add(i)
                write(f"pycli: {found.why.removesuffix(' first')}; torchrun's agents go on without it")
        return failed(0)

    # The handler first: a Ctrl-C as the ranks start (they run in sessions of their own and
    # never see the terminal's) must stop them, not end pycli with a KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        processes.extend(RemoteProcess(host, line, f"[{host.name}] " if many else "", show) for host, line in commands)
        if stopping.is_set():  # Ctrl-C came while they started: those after it have not heard
            stop_all()
        for proc in processes:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if stopping.is_set():
                        # Ranks that do not end on Ctrl-C: drop the connections (the sweep follows).
                        if not user_interrupt.is_set() and time.monotonic() - stop_asked[0] > STOP_GRACE_S:
                            for other in processes:
                                other.kill()
                        continue
                    if deadline is not None and time.monotonic() > deadline:
                        first.append(JobExit(EXIT_FAILED, f"its --time-limit of {time_limit_s:g} s passed", timed_out=True))
                        write(f"pycli: the job passed its --time-limit of {time_limit_s:g} s; stopping it on every node")
                        stop_all()
                    # One node's failure (torchrun: one launcher per node) must end the others.
                    elif many and (found := one_failed()) is not None:
                        first.append(found)
                        stop_all()
    finally:
        signal.signal(signal.SIGINT, previous)
    if user_interrupt.is_set():
        return JobExit(EXIT_INTERRUPTED, "interrupted")
    codes = [proc.proc.returncode for proc in processes]
    code = codes[0] if carry_on else next((c for c in codes if c != 0), 0)
    seen = first[0] if first else (failed(0) if carry_on else failed_first())
    if seen is not None and seen.timed_out:
        return seen
    # The launcher named the rank: say which, where and how, unless pycli saw a node go first.
    if code and ranks.first is not None and not (seen is not None and seen.lost):
        return JobExit(code, f"{ranks.first.describe()} first")
    return JobExit(code, seen.why if seen is not None else "")
