"""`pycli provision --batch` (pycli/provision/rolling.py): the plan, the parsers of what runs on a
node and of the gate's answer, the flags refused in one line, and the wait for a resumed node's
slurmd (Slurm's answers and SSH replaced, the clock too)."""

import pytest

from rich.console import Console

from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import NodeOutput
from pycli.cluster.slurm_nodes import parse_sinfo_nodes
from pycli.core.errors import BadInput
from pycli.jobs.launch import NodeLayout
from pycli.provision import rolling
from pycli.provision.rolling import (
    RollingRequest,
    check_request,
    gate_line,
    jobs_command,
    parse_job_processes,
    parse_slurm_jobs,
    plan_batches,
    probe_line,
    silent_nodes,
)
from pycli.provision.run import ProvisionRequest
from pycli_node.gpu_probe import MARK
from tests.conftest import ROOT, run_pycli

RECORDED = ROOT / "tests" / "fixtures" / "recorded"


def test_idle_nodes_go_first_in_batches_of_the_size_asked():
    names = ["node1", "node2", "node3", "node4", "node5"]
    jobs = {"node1": ["42 (alice)"], "node3": ["43 (bob)"], "node4": []}
    assert plan_batches(names, jobs, 2) == [("node2", "node4"), ("node5", "node1"), ("node3",)]
    assert plan_batches(names, jobs, 1) == [("node2",), ("node4",), ("node5",), ("node1",), ("node3",)]
    assert plan_batches(names, {}, 10) == [tuple(names)]


def test_slurms_jobs_are_read_by_node_and_queued_ones_hold_no_node():
    # squeue's SQUEUE_FORMAT: id|user|state|reason|nodes count|nodes|batch host|name
    out = ("42|alice|RUNNING|None|2|node[1-2]|node1|train\n"
           "43|bob|COMPLETING|None|1|node3|node3|x\n"
           "44|carol|PENDING|Resources|2||(null)|waits\n"
           "45|dave|RUNNING|None|1|node9|node9|elsewhere\n")
    assert parse_slurm_jobs(out, ["node1", "node2", "node3", "node4"]) == {
        "node1": ["42 (alice)"], "node2": ["42 (alice)"], "node3": ["43 (bob)"], "node4": []}


def test_a_nodes_pycli_jobs_are_the_job_folders_its_processes_name():
    layout = NodeLayout.from_settings({})
    jobs = str(layout.jobs_dir)
    out = (f"101 python {jobs}/20261207-010203-77/workloads/mnist.py --epochs 2\n"
           f"102 bash -c cd {jobs}/20261207-010203-77 && exec env ...\n"
           f"103 torchrun --rdzv-id x {jobs}/20261207-020304-5\n"
           f"104 python {jobs}/20261207-020304-512x/not-a-job-folder\n"
           "105 sshd: root@notty\n")
    assert parse_job_processes(out, jobs) == ["20261207-010203-77", "20261207-020304-5"]
    assert parse_job_processes("", jobs) == []
    # The pattern does not name the shell that runs it, and pgrep finding nothing is no failure.
    assert jobs_command(layout).endswith("|| true") and f"'[/]{jobs[1:]}" in jobs_command(layout)


def test_the_gates_line_is_its_last_without_the_drain_it_found():
    drained = "pycli health: nvidia1: 1 pending row remap (drained already: pycli rolling change: batch 1 of 2; left so)\n"
    assert gate_line("node2", False, drained, "exit 1") == (False, "pycli health: nvidia1: 1 pending row remap")
    assert gate_line("node2", True, "pycli health: healthy\n", "") == (True, "pycli health: healthy")
    assert gate_line("node2", False, "", "node2 does not answer") == (False, "node2 does not answer")
    assert gate_line("node2", False, "bad\x1b[31m\n", "") == (False, "bad?[31m")


def _probe(smi: str) -> str:
    return f"{MARK} nvidia-smi\n{smi}\n{MARK} rc 0\n{MARK} xid\n{MARK} rc 0\n"


def test_without_slurm_the_gate_is_the_gpu_probe():
    assert probe_line("node1", True, f"{MARK} none\n", "") == (True, "no NVIDIA GPU")
    ok, line = probe_line("node1", True, _probe((RECORDED / "nvidia-smi-q-h100-580.txt").read_text()), "")
    assert ok and line.endswith("GPU(s) healthy"), line
    ok, line = probe_line("node1", True, _probe((RECORDED / "nvidia-smi-q-a100-remap-pending.txt").read_text()), "")
    assert not ok and "remap" in line, line
    assert probe_line("node1", False, "", "ssh: connect refused") == (False, "the GPU probe did not run (ssh: connect refused)")


@pytest.mark.parametrize(("rolling", "message"), [
    ({"batch": 0}, "--batch 0: give how many nodes"),
    ({"batch": 1, "job_wait_s": -1}, "--job-wait -1: give the seconds"),
])
def test_bad_rolling_requests_are_one_line(rolling, message):
    with pytest.raises(BadInput, match=message):
        RollingRequest(**rolling)


@pytest.mark.parametrize(("request_", "message"), [
    (ProvisionRequest(check=True), "--check changes nothing: use --batch N --dry-run"),
    (ProvisionRequest(retry=True), "--retry takes up a provisioning that did not finish"),
])
def test_a_roll_refuses_what_it_cannot_be(request_, message):
    with pytest.raises(BadInput, match=message):
        check_request(request_)


@pytest.mark.parametrize(("args", "message"), [
    (["--batch", "0"], "--batch 0: give how many nodes may be out of service at once"),
    (["--dry-run"], "--dry-run belong(s) to a rolling change: add --batch N"),
    (["--cancel-jobs", "--job-wait", "60"], "--job-wait, --cancel-jobs belong(s) to a rolling change: add --batch N"),
    (["--batch", "1", "--check"], "--check changes nothing: use --batch N --dry-run"),
])
def test_the_rolling_flags_as_typed_are_refused_in_one_line(tmp_path, args, message):
    inventory = tmp_path / "cluster.ini"
    inventory.write_text("[gpu_nodes]\nnode1 ansible_host=10.0.0.1\n")
    proc = run_pycli("provision", str(inventory), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


SINFO_AFTER_RESUME = "node1|idle*|gpu:2|none\nnode2|drained|gpu:2|pycli rolling change: batch 2 of 2\nnode3|down*|gpu:2|Not responding\n"


def test_a_resumed_node_is_silent_until_its_slurmd_answers_slurmctlds_ping():
    states = parse_sinfo_nodes(SINFO_AFTER_RESUME)
    assert [states[node].answering for node in ("node1", "node2", "node3")] == [False, True, False]
    assert silent_nodes(states, ["node1", "node2", "node4"]) == {"node1": "idle*", "node4": "not in sinfo"}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _silent_roll(monkeypatch, answers: list[str], restart_ok: bool = True):
    """A roll on a Slurm cluster whose sinfo answers `answers` in turn (the last one from then on);
    what silent_slurmds returned, the lines said and the restarts sent."""
    cluster = Cluster(hosts=tuple(Host(name=f"node{i}", address=f"10.9.0.{i}", user="root") for i in (1, 2)),
                      launcher="node1", slurm_controller="node1")
    clock, restarts, asked = _Clock(), [], iter(answers)
    last = [answers[-1]]

    def states(_cluster):
        last[0] = next(asked, last[0])
        return parse_sinfo_nodes(last[0])

    def ssh_each(commands, **_):
        restarts.extend((host.name, command) for host, command in commands)
        return {host.name: NodeOutput(host.name, 0 if restart_ok else 1, "", "" if restart_ok else "Failed to restart")
                for host, _ in commands}

    monkeypatch.setattr(rolling, "time", clock)
    monkeypatch.setattr(rolling, "node_states", states)
    monkeypatch.setattr(rolling, "ssh_each", ssh_each)
    console = Console(record=True, width=200)
    roll = rolling._Roll(cluster, ProvisionRequest(), RollingRequest(batch=1), console)
    return roll.silent_slurmds(["node1"]), console.export_text(), restarts, clock.now


def test_the_next_batch_waits_for_the_resumed_nodes_slurmd_to_answer(monkeypatch):
    found, said, restarts, waited = _silent_roll(monkeypatch, ["node1|idle*|(null)|none\n"] * 3 + ["node1|idle|(null)|none\n"])
    assert (found, said, restarts, waited) == ({}, "", [], 3.0)


def test_a_slurmd_still_silent_is_restarted_once_then_the_node_fails(monkeypatch):
    found, said, restarts, waited = _silent_roll(monkeypatch, ["node1|idle*|(null)|none\n"])
    assert restarts == [("node1", rolling.RESTART_SLURMD)]
    assert "Slurm hears nothing from the slurmd of node1 (idle*) after 20 s: restarting it there" in said
    assert found == {"node1": "slurmctld hears nothing from its slurmd (idle*) 120 s after the change"}
    assert waited == rolling.SLURMD_ANSWER_WAIT_S


def test_a_slurmd_that_cannot_be_restarted_fails_at_once(monkeypatch):
    found, _, _, waited = _silent_roll(monkeypatch, ["node1|idle*|(null)|none\n"], restart_ok=False)
    assert list(found) == ["node1"] and found["node1"].startswith("restarting its slurmd failed: ")
    assert waited == rolling.SLURMD_NUDGE_S
