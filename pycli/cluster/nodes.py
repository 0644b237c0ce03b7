"""The one place that touches nodes outside playbooks.

Two ways in, both with the inventory's own connection settings and host keys checked:
ad-hoc commands through the one runner adapter (`run_on_nodes`, every host answers with a
`NodeOutput`), and OpenSSH itself (`ssh_argv`) for what must not go through Ansible: a new
login each time (`ssh_probe`), short commands on many nodes at once (`ssh_each`), a byte
stream into or out of one node (`ssh_stream`: a job's files, its results) and a job's
processes, their output streamed (`RemoteProcess`).

A host whose inventory says `ansible_connection=local` (Host.local) is the machine pycli runs
on: `node_argv`, the one place that decides, runs its commands with bash here instead of over
ssh, so every function above serves it unchanged; it never has a kept connection to open or
close, and a job's processes on it are a process group of their own (`RemoteProcess`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pycli.cluster import runner
from pycli.cluster.model import Cluster, Host
from pycli.core.paths import ssh_control_dir

SSH_TIMEOUT_S = 10
# OpenSSH exits 255 on its own errors: the connection failed, keepalives went unanswered, or
# the remote command was killed by a signal.
SSH_FAILED = 255
# A job's SSH sessions ask every 15 s whether the node still answers, and give up after 4 misses.
KEEPALIVE_S = 15
KEEPALIVE_MISSES = 4
# A shared connection (ssh_argv's `shared`) stays open this long after its last command.
SHARED_PERSIST_S = 60


@dataclass(frozen=True)
class NodeOutput:
    """What one node answered to one command; rc None when Ansible could not reach it."""

    host: str
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        """The most telling line of a failure."""
        for text in (self.stderr, self.message, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return f"exit {self.rc}" if self.rc is not None else "no answer"


_EVENT_OUTCOMES = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")


def node_output_from_event(event: Mapping[str, object]) -> NodeOutput | None:
    """One ansible-runner host event as a NodeOutput (None for every other event)."""
    if event.get("event") not in _EVENT_OUTCOMES:
        return None
    data = event.get("event_data")
    data = data if isinstance(data, Mapping) else {}
    res = data.get("res")
    res = res if isinstance(res, Mapping) else {}
    host = str(data.get("host"))
    if event["event"] == "runner_on_unreachable":
        return NodeOutput(host, None, message=str(res.get("msg", "unreachable")))
    rc = res.get("rc")
    if rc is None:
        rc = 1 if event["event"] == "runner_on_failed" else 0
    return NodeOutput(host, int(rc), str(res.get("stdout", "")), str(res.get("stderr", "")), str(res.get("msg", "")))


def run_on_nodes(
    cluster: Cluster, hosts: Sequence[str], run_dir: Path, command: str | None = None, *, module: str = "ansible.builtin.shell"
) -> dict[str, NodeOutput]:
    """Run a bash `command` (or a module without arguments, e.g. ping) on `hosts`; every host answers."""
    args = ""
    if command is not None:
        if any(marker in command for marker in ("{{", "{%", "{#")):
            raise ValueError("Ansible would template this command; it must not hold Jinja markers")
        args = json.dumps({"cmd": command, "executable": "/bin/bash"})
    request = runner.RunRequest(inventory=cluster.inventory_path, pattern=",".join(hosts), module=module, module_args=args)
    answers: dict[str, NodeOutput] = {}

    def on_event(event: Mapping[str, object]) -> None:
        if (output := node_output_from_event(event)) is not None:
            answers[output.host] = output

    runner.run(request, run_dir, on_event=on_event)
    return {host: answers.get(host, NodeOutput(host, None, message="Ansible reported nothing for it")) for host in hosts}


def ssh_argv(host: Host, command: str, *, tty: bool = True, shared: bool = False) -> list[str]:
    """OpenSSH with the host's inventory settings; host keys checked as Ansible checks them.

    The user is -l's value and the host follows "--": neither can be read as an option. A host
    that stops answering ends the session (ssh exits 255) after KEEPALIVE_S x KEEPALIVE_MISSES.
    `tty`: a pseudo-terminal (a job's Ctrl-C; output comes back with CRLF, stderr merged);
    without one, stdin and stdout carry bytes (a tar stream). `shared`: one connection per
    node that later commands reuse while it is kept open (`ControlMaster`), for the short
    commands around a job; a login that must be new (`ssh_probe`) never shares."""
    # ssh keeps the first value it reads: host-key checking before the inventory's options, the
    # timeouts after them (an inventory may set its own).
    argv = ["ssh", "-tt" if tty else "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"]
    if shared:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={ssh_control_dir() / '%C'}",
                 "-o", f"ControlPersist={SHARED_PERSIST_S}"]
    return [*argv, "-p", str(host.port), *host.ssh_options,
            "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", "-o", f"ServerAliveInterval={KEEPALIVE_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_MISSES}",
            "-l", host.login_user, "--", host.address, command]


def node_argv(host: Host, command: str, *, tty: bool = True, shared: bool = False) -> list[str]:
    """The argv that runs the shell line `command` on `host`: over OpenSSH (ssh_argv, its `tty`
    and `shared`), or for a local host, bash on this machine, as sshd would run it in the
    user's shell. Without a pseudo-terminal there: output comes back as written (LF), and
    stderr stays apart unless the caller merges it."""
    if host.local:
        return ["bash", "-c", command]
    return ssh_argv(host, command, tty=tty, shared=shared)


def connection_lost(host: Host, rc: int | None) -> bool:
    """`rc` is ssh's own failure: the host stopped answering (never so for a local host, whose
    commands may exit 255 themselves)."""
    return rc == SSH_FAILED and not host.local


def ssh_probe(hosts: Sequence[Host], command: str = "true") -> dict[str, NodeOutput]:
    """A new SSH login to every host at once, with the inventory's settings and host keys checked.

    OpenSSH directly rather than Ansible: Ansible keeps connections open (ControlPersist),
    and a kept connection outlives a stopped sshd, which is exactly what this must see. A local
    host answers without SSH: its command runs here (node_argv).
    """
    return ssh_each([(host, command) for host in hosts])


def ssh_each(commands: Sequence[tuple[Host, str]], timeout_s: float = 3 * SSH_TIMEOUT_S, *,
             shared: bool = False, stdin: bytes | None = None) -> dict[str, NodeOutput]:
    """Each host's own command, all at once over OpenSSH (a new login each unless `shared`; a
    local host's here, node_argv); what each answered.

    `stdin`: the same bytes on every command's stdin (a small bundle of files), sent without a
    pseudo-terminal, which would mangle them. Shared connections run without one too: stdout
    and stderr come back apart. A kept connection can be dead while its master process still
    runs (the node restarted, or stopped answering): where ssh itself failed through one, the
    master is closed and the command runs once more, on a new connection."""
    answers = _ssh_all(commands, timeout_s, shared, stdin)
    if shared:
        again = [(host, command) for host, command in commands if _through_dead_connection(host, answers[host.name].rc)]
        if again:
            answers.update(_ssh_all(again, timeout_s, shared, stdin))
    return answers


def _through_dead_connection(host: Host, rc: int | None) -> bool:
    """ssh failed (or was killed) through a kept connection to `host`: closes it, and says whether
    the command failed in ssh itself, so that running it again on a new connection is worth it."""
    if host.local:
        return False  # nothing is kept open to a local host
    return (rc == SSH_FAILED or (rc or 0) < 0) and close_shared_connection(host) and rc == SSH_FAILED


def _start(host: Host, argv: list[str], detached: bool = False, **popen: Any) -> subprocess.Popen[bytes]:
    """A node command started here. A local host's is a process group of its own, so that ending
    it (_end) ends what it started too: a child that holds the output pipe open would otherwise
    keep the answer back past any timeout. Over ssh, ending ssh ends the remote side.
    `detached`: in a session of its own over ssh too (ssh_stream)."""
    return subprocess.Popen(argv, start_new_session=host.local or detached, **popen)


def _end(host: Host, proc: subprocess.Popen[bytes]) -> None:
    """Kill a command _start started (a local host's whole group)."""
    if host.local:
        signal_group(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()


def signal_group(pid: int, signum: int) -> None:
    """`signum` to every process of the group `pid` leads (the leader may have ended already)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pid, signum)


def _ssh_all(commands: Sequence[tuple[Host, str]], timeout_s: float, shared: bool,
             stdin: bytes | None) -> dict[str, NodeOutput]:
    started: dict[str, tuple[Host, subprocess.Popen[bytes]]] = {}
    answers: dict[str, NodeOutput] = {}

    def finish(name: str, host: Host, proc: subprocess.Popen[bytes]) -> None:
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
            why_not = b""
        except subprocess.TimeoutExpired:
            _end(host, proc)
            out, err = _leftover_output(host, proc, shared)
            why_not = f"\nno answer within {timeout_s:g} s".encode()
        answers[name] = NodeOutput(name, proc.returncode, _text(out), _text(err + why_not))

    try:
        for host, command in commands:
            argv = node_argv(host, command, tty=not shared and stdin is None, shared=shared)
            started[host.name] = host, _start(host, argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Every command gets its stdin and is waited for at once: commands that wait for each other
        # (the two ranks of a pair's allreduce) would each block the other's stdin, one at a time.
        waiting = [threading.Thread(target=finish, args=(name, *item), daemon=True) for name, item in started.items()]
        for thread in waiting:
            thread.start()
        for thread in waiting:
            thread.join()
    except BaseException:
        # Ctrl-C reaches ssh here, not a local host's group of its own: that ends with pycli too.
        for host, proc in started.values():
            _end(host, proc)
        raise
    return {name: answers[name] for name in started}


def _leftover_output(host: Host, proc: subprocess.Popen[bytes], shared: bool) -> tuple[bytes, bytes]:
    """What a command killed for its timeout had written. Through a kept connection the output
    pipes are not the killed ssh's alone: it handed them to the connection's master, which keeps
    them open until the node answers or its keepalives run out (a minute for a frozen node).
    That master is closed first, and the pipes are read for a moment at most."""
    if shared:
        close_shared_connection(host)
    try:
        return proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return b"", b""


def _text(output: bytes) -> str:
    return output.decode(errors="replace").replace("\r", "")


def ssh_stream(host: Host, command: str, *, send: Callable[[IO[bytes]], None] | None = None,
               receive: Callable[[IO[bytes]], None] | None = None, timeout_s: float,
               detached: bool = False) -> NodeOutput:
    """`command` on `host` over its shared connection, `send` writing the bytes of its stdin (a tar
    stream of a job's files) or `receive` reading those of its stdout (the job's results); what it
    answered (stdout too when nothing reads it).

    Whatever stops the stream on this side (the node stopped reading, a reader's error) is said
    in the answer's stderr with the node's own words; the answer is then not ok. Where ssh
    failed through a dead kept connection, the master is closed and the command runs once
    more from the start, its stream with it: `send` and `receive` must give the same result
    when called again (the node unpacks into a fresh folder, the reader overwrites).

    `detached`: ssh (or a local host's command) in a session of its own, out of reach of the
    terminal's Ctrl-C: a command that must end for the caller to know what it did (sbatch, whose
    job the caller cancels once it has its id)."""
    answer = _stream_once(host, command, send, receive, timeout_s, detached)
    if _through_dead_connection(host, answer.rc):
        answer = _stream_once(host, command, send, receive, timeout_s, detached)
    return answer


def _stream_once(host: Host, command: str, send: Callable[[IO[bytes]], None] | None,
                 receive: Callable[[IO[bytes]], None] | None, timeout_s: float, detached: bool = False) -> NodeOutput:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = _start(host, node_argv(host, command, tty=False, shared=True), detached=detached,
                      stdin=subprocess.DEVNULL if send is None else subprocess.PIPE,
                      stdout=out if receive is None else subprocess.PIPE, stderr=err)
        try:
            return _stream_answer(host, proc, send, receive, timeout_s, out, err)
        except BaseException:
            _end(host, proc)  # Ctrl-C: a local host's group of its own ends with pycli too
            raise


def _stream_answer(host: Host, proc: subprocess.Popen[bytes], send: Callable[[IO[bytes]], None] | None,
                   receive: Callable[[IO[bytes]], None] | None, timeout_s: float, out: IO[bytes],
                   err: IO[bytes]) -> NodeOutput:
    broken = ""
    try:
        if send is not None:
            assert proc.stdin is not None
            with proc.stdin:
                send(proc.stdin)
        if receive is not None:
            assert proc.stdout is not None
            with proc.stdout:
                receive(proc.stdout)
                # A reader may stop at the end of what it wants (a tar archive's end marker)
                # before the sender has written its last bytes (tar's record padding). ssh
                # takes those itself; a local host's sender writes into this pipe and would
                # die of SIGPIPE (exit 141) if it were closed first.
                while proc.stdout.read(2**16):
                    pass
    except Exception as error:  # any reason the stream stopped is part of the answer
        broken = f"\nthe stream broke off: {error}"
        if receive is not None:
            _end(host, proc)  # nothing reads what it sends now; a node that stopped reading says why itself
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end(host, proc)
        code = proc.wait()
        broken += f"\nno answer within {timeout_s:g} s"
    out.seek(0)
    err.seek(0)
    if broken and code == 0:
        code = 1  # ssh ended well, but what it carried did not
    return NodeOutput(host.name, code, _text(out.read()), _text(err.read()) + broken)


def close_shared_connection(host: Host) -> bool:
    """Close the kept connection to `host` (ssh_argv's `shared`), if one is open; whether one was."""
    if host.local:
        return False
    def control(operation: str) -> int:
        argv = ["ssh", "-o", f"ControlPath={ssh_control_dir() / '%C'}", "-p", str(host.port), *host.ssh_options,
                "-l", host.login_user, "-O", operation, "--", host.address]
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=SSH_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            return -1

    if control("check") != 0:
        return False
    control("exit")
    return True


class RemoteProcess:
    """One command on one node over `ssh -tt` (node_argv), its output streamed with a prefix.

    A pseudo-terminal on the far side means an interrupt byte reaches the remote process
    as SIGINT, exactly as Ctrl-C would in an interactive session. On a local host the command
    is a process group of its own here, and SIGINT goes to that group instead.
    """

    def __init__(self, host: Host, command: str, prefix: str, write: Callable[[str], None]) -> None:
        self.host = host
        self.prefix = prefix
        self.write = write
        self.proc = subprocess.Popen(
            node_argv(host, command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            # Our Ctrl-C is forwarded, not delivered to ssh (or a local job) directly; a local
            # job's processes share this new group, which interrupt() and kill() reach.
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n").replace("\r", "")
            self.write(f"{self.prefix}{line}" if self.prefix else line)

    def interrupt(self) -> None:
        if self.host.local:
            self._signal_group(signal.SIGINT)
            return
        if self.proc.poll() is None and self.proc.stdin:
            try:
                self.proc.stdin.write(b"\x03")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code

    def kill(self) -> None:
        # Over ssh the remote side gets SIGHUP when ssh goes; here nothing would end the ranks
        # a local launcher started, so the whole group goes.
        if self.host.local:
            self._signal_group(signal.SIGKILL)
        elif self.proc.poll() is None:
            self.proc.kill()

    def _signal_group(self, signum: int) -> None:
        signal_group(self.proc.pid, signum)
