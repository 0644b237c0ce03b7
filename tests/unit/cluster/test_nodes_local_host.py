"""A host with ansible_connection=local: read from the inventory `inventory new --local` writes,
its commands run here with bash (nodes.node_argv), its job's process group interrupted and
killed as a whole, and launcher lines that every launcher takes for this machine."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pycli.cli.app import main
from pycli.cli.inventory import LOCAL_HOST_NAME, local_host_entry, local_slots
from pycli.cluster import nodes
from pycli.cluster.model import Host, current_user, load_cluster
from pycli.cluster.nodes import RemoteProcess, close_shared_connection, connection_lost, node_argv, ssh_each
from pycli.core.errors import EXIT_INTERRUPTED
from pycli.jobs import processes as job_processes
from pycli.jobs.launch import launch_commands
from pycli_node.gpu_reports import count_listed_gpus
from tests.conftest import process_gone, wait_process_gone
from tests.unit.jobs.test_train_plan import plan

HERE = Host(LOCAL_HOST_NAME, LOCAL_HOST_NAME, slots=4, local=True)
FAR = Host("n1", "10.9.0.1", user="train")


def _local_inventory(tmp_path: Path, *args: str) -> Path:
    output = tmp_path / "local.ini"
    assert main(["inventory", "new", "-o", str(output), "--local", *args]) == 0
    return output


# ------------------------------------------------------------------ the inventory


def test_inventory_new_local_writes_this_machine_reached_without_ssh(tmp_path, capsys):
    inventory = _local_inventory(tmp_path, "--slots", "3", "--venv", "/opt/torch/.venv", "--work-dir", str(tmp_path / "w"))
    text = inventory.read_text()
    become = " ansible_become=false" if os.geteuid() == 0 else ""
    assert f"[nodes]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}{become}\n" in text
    assert "slots=3\n" in text and "common_venv_path=/opt/torch/.venv\n" in text
    cluster = load_cluster(inventory)
    (host,) = cluster.hosts
    assert (host.name, host.address, host.slots, host.local) == ("localhost", "localhost", 3, True)
    assert cluster.settings == {"common_venv_path": "/opt/torch/.venv", "common_work_dir": str(tmp_path / "w")}
    capsys.readouterr()
    assert main(["inventory", "show", str(inventory)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:2] == ["localhost", "localhost"] and row[-3:] == ["local", "3", "yes"]  # PORT: local, not 22


def test_root_on_this_machine_needs_no_sudo_and_a_user_keeps_the_playbooks_become():
    assert local_host_entry("/py", root=True).extra["ansible_become"] == "false"
    assert "ansible_become" not in local_host_entry("/py", root=False).extra


def test_a_relative_venv_is_taken_from_here_for_a_local_host(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inventory = _local_inventory(tmp_path, "--venv", "venvs/torch")
    assert f"common_venv_path={tmp_path}/venvs/torch\n" in inventory.read_text()


def test_ansible_connection_local_is_read_from_any_inventory_and_runs_as_pycli_s_user(tmp_path):
    inventory = tmp_path / "mixed.ini"
    inventory.write_text("[nodes]\nn1 ansible_host=10.9.0.1 ansible_user=train\n"
                         "here ansible_host=127.0.0.2 ansible_connection=local ansible_user=other\n")
    far, here = load_cluster(inventory).hosts
    assert (far.local, here.local) == (False, True)
    # Ansible's local connection runs as whoever runs it, whatever ansible_user says; so do a local host's ranks.
    assert (far.login_user, here.login_user) == ("train", current_user())


@pytest.mark.parametrize("given, gpus, slots", [(None, 8, 8), (2, 8, 2), (None, 0, 1), (5, 0, 5)])
def test_local_slots_are_the_option_else_one_per_gpu_else_one(given, gpus, slots):
    assert local_slots(given, gpus) == slots


def test_the_gpus_nvidia_smi_lists_are_counted_without_their_mig_devices():
    listed = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
              "  MIG 3g.40gb     Device  0: (UUID: MIG-a)\n"
              "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n")
    assert count_listed_gpus(listed) == 2 and count_listed_gpus("") == 0


# ------------------------------------------------------------------ the seam


def test_a_local_host_runs_its_line_with_bash_an_ssh_host_over_ssh():
    assert node_argv(HERE, "echo hi") == ["bash", "-c", "echo hi"]
    assert node_argv(HERE, "echo hi", tty=False, shared=True) == ["bash", "-c", "echo hi"]
    far = node_argv(FAR, "echo hi", shared=True)
    assert far[0] == "ssh" and far[-3:] == ["--", "10.9.0.1", "echo hi"] and "ControlMaster=auto" in far


def test_a_local_host_has_no_kept_connection_and_is_never_lost():
    assert close_shared_connection(HERE) is False
    assert not connection_lost(HERE, 255) and connection_lost(FAR, 255) and not connection_lost(FAR, 1)


def test_commands_on_a_local_host_run_here_with_their_stdin(tmp_path):
    marker = tmp_path / "ran"
    answers = ssh_each([(HERE, f"cat; touch {shlex.quote(str(marker))}; echo err >&2; exit 255")], stdin=b"bytes in",
                       shared=True)
    answer = answers[LOCAL_HOST_NAME]
    assert (answer.rc, answer.stdout, answer.stderr) == (255, "bytes in", "err\n")
    assert marker.exists()  # once: a local 255 is the command's own, never a dead connection to retry
    stream = nodes.ssh_stream(HERE, "cat >/dev/null; echo received", send=lambda stdin: stdin.write(b"x" * 100_000),
                              timeout_s=30)
    assert stream.ok and stream.stdout == "received\n"


def test_a_reader_that_stops_early_does_not_kill_a_local_sender_with_sigpipe():
    # As tarfile stops at the archive's end marker while tar still writes its record padding:
    # the bytes after what the reader wanted are taken too, so the sender ends well (not 141).
    def first_line(stdout) -> None:
        assert stdout.readline() == b"the end marker\n"

    answer = nodes.ssh_stream(HERE, "echo 'the end marker'; sleep 0.3; head -c 1000000 /dev/zero", receive=first_line,
                              timeout_s=30)
    assert answer.ok, answer


def test_a_local_hosts_hung_command_ends_at_its_timeout_with_what_it_started(tmp_path):
    # bash's child holds the output pipe: killing bash alone left the answer waiting for the child.
    pid_file = tmp_path / "child"
    started = time.monotonic()
    answers = ssh_each([(HERE, f"sleep 300 & echo $! > {shlex.quote(str(pid_file))}; wait")], timeout_s=1)
    answer = answers[LOCAL_HOST_NAME]
    assert time.monotonic() - started < 20 and not answer.ok and "no answer within 1 s" in answer.stderr, answer
    assert wait_process_gone(int(pid_file.read_text()))
    started = time.monotonic()
    stream = nodes.ssh_stream(HERE, f"sleep 300 & echo $! > {shlex.quote(str(pid_file))}; wait", timeout_s=1)
    assert time.monotonic() - started < 20 and not stream.ok and "no answer within 1 s" in stream.stderr, stream
    assert wait_process_gone(int(pid_file.read_text()))


def test_interrupting_a_local_process_sends_sigint_to_its_whole_group():
    # bash waits for its foreground child; SIGINT to the group ends the child and runs bash's trap.
    # The child itself says it started, from after its exec: a SIGINT that came between bash's fork
    # and the child's exec would be lost, and bash's trap would wait out the sleep.
    lines: list[str] = []
    # As run_processes does while a job runs: pycli handles SIGINT, so the job starts with
    # SIGINT's default. A process started in the background by a script (a CI runner) ignores
    # SIGINT; the job would inherit that, and neither bash's trap nor the sleep could hear it.
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        proc = RemoteProcess(HERE, "trap 'echo interrupted; exit 7' INT; sh -c 'echo started; exec sleep 60'; echo never", "",
                             lines.append)
    finally:
        signal.signal(signal.SIGINT, previous)
    _wait_for(lambda: lines == ["started"])
    proc.interrupt()
    assert proc.wait(timeout=10) == 7
    assert lines == ["started", "interrupted"]


def test_killing_a_local_process_kills_what_it_started_too():
    lines: list[str] = []
    # The child survives its parent's SIGKILL unless the whole group is killed (no sshd sends SIGHUP here).
    proc = RemoteProcess(HERE, "trap '' INT; sleep 300 & echo $!; wait", "", lines.append)
    _wait_for(lambda: bool(lines))
    child = int(lines[0])
    proc.interrupt()  # SIGINT ignored by both: nothing ends
    time.sleep(0.3)
    assert proc.proc.poll() is None and not process_gone(child)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert wait_process_gone(child), f"pid {child} outlived kill()"


def _wait_for(condition, within_s: float = 10) -> None:
    end = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_local_rank_exiting_255_failed_it_did_not_stop_answering(monkeypatch):
    hosts = (HERE,)
    monkeypatch.setattr(job_processes, "launch_commands", lambda plan: [(HERE, "sleep 0.2; exit 255")])
    ended = job_processes.run_processes(SimpleNamespace(hosts=hosts, restarts_by_agents=False), lambda line: None)
    assert (ended.code, ended.why, ended.lost) == (255, "exit 255 on localhost", False)


def test_ctrl_c_during_a_local_job_interrupts_its_group_and_says_interrupted(monkeypatch):
    said: list[str] = []
    line = "trap 'echo rank interrupted; exit 130' INT; sh -c 'echo rank up; exec sleep 60'"  # as above
    monkeypatch.setattr(job_processes, "launch_commands", lambda plan: [(HERE, line)])

    def interrupt_when_up(text: str) -> None:
        said.append(text)
        if text == "rank up":
            os.kill(os.getpid(), signal.SIGINT)  # as the user's Ctrl-C reaches pycli

    ended = job_processes.run_processes(SimpleNamespace(hosts=(HERE,), restarts_by_agents=False), interrupt_when_up)
    assert ended.code == EXIT_INTERRUPTED
    assert said == ["rank up", "pycli: interrupting the job on every node (Ctrl-C again to stop waiting)", "rank interrupted"]


# ------------------------------------------------------------------ launcher lines


def _argv(p):
    ((host, line),) = launch_commands(p)
    assert host is p.rank0
    return shlex.split(line.split(" && exec env ", 1)[1])


def test_every_launcher_takes_the_local_host_for_this_machine():
    from pycli.cluster.model import Cluster

    here = Cluster(hosts=(HERE,), launcher=HERE.name)
    horovod = _argv(plan(here, np=4, launcher="horovod"))
    assert horovod[horovod.index("-H") + 1] == "localhost:4" and "-p" not in horovod
    mpirun = _argv(plan(here, np=4, launcher="mpirun"))
    assert mpirun[mpirun.index("-H") + 1] == "localhost:4" and "plm_rsh_args" not in mpirun
    assert ("--allow-run-as-root" in mpirun) == (current_user() == "root")
    torchrun = _argv(plan(here, np=4, workload="ddp"))
    assert torchrun[torchrun.index("--master-addr") + 1] == "localhost"
    assert torchrun[torchrun.index("--nproc-per-node") + 1] == "4"
