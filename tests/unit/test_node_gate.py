"""pycli.node_gate, as Slurm runs it on a node: real processes, stand-in tools where this machine
has none (nvidia-smi printing a real machine's recorded output, scontrol and munge writing down
what they were asked)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycli import node_gate

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
PROJECT = Path(__file__).resolve().parents[2]


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's tools: scontrol answers from state.txt and logs its updates; munge works."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "state.txt"
    state.write_text("NodeName=node2 Arch=x86_64 State=IDLE ThreadsPerCore=1 Reason=\n")
    log = tmp_path / "scontrol.log"
    _tool(bin_dir, "scontrol", f'if [ "$1" = show ]; then cat {state}; else echo "$@" >> {log}; fi\n')
    _tool(bin_dir, "munge", "echo credential\n")
    _tool(bin_dir, "unmunge", "cat >/dev/null; echo STATUS: Success\n")
    _tool(bin_dir, "sudo", "exit 1\n")
    _tool(bin_dir, "journalctl", "echo 'kernel: nothing to see'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir, state, log


def _updates(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_healthy_node_without_gpus_passes_and_nothing_changes(node, capsys):
    _, _, log = node
    assert node_gate.health("node2", ["/"], 0.001) == 0
    assert capsys.readouterr().out.startswith("pycli health: healthy")
    assert _updates(log) == []


def test_a_pending_row_remap_drains_the_node_with_the_gates_reason(node, capsys):
    bin_dir, state, log = node
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    assert node_gate.health("node2", ["/"], 0.001) == 1
    [update] = _updates(log)
    assert update.startswith("update nodename=node2 state=drain reason=pycli health: GPU 0")
    assert "a row remap is pending" in update
    # Drained already with that reason: not asked again at the next interval.
    state.write_text(f"NodeName=node2 State=IDLE+DRAIN Reason={update.split('reason=', 1)[1]} [root@2026-11-26T10:00:00]\n")
    assert node_gate.health("node2", ["/"], 0.001) == 1
    assert len(_updates(log)) == 1
    # Repaired: the gate resumes what it drained.
    (bin_dir / "nvidia-smi").unlink()
    assert node_gate.health("node2", ["/"], 0.001) == 0
    assert _updates(log)[-1] == "update nodename=node2 state=resume"


def test_a_drain_for_any_other_reason_stays(node):
    _, state, log = node
    state.write_text("NodeName=node2 State=IDLE+DRAIN Reason=pycli: fenced by check --deep [root@2026-11-26T10:00:00]\n")
    assert node_gate.health("node2", ["/"], 0.001) == 0
    assert _updates(log) == []


def test_disk_space_and_munge_are_part_of_the_health_check(node, tmp_path):
    bin_dir, _, log = node
    _tool(bin_dir, "unmunge", "cat >/dev/null; echo 'unmunge: Error: Invalid credential' >&2; exit 1\n")
    assert node_gate.health("node2", ["/", str(tmp_path / "missing")], 10**9) == 1
    [update] = _updates(log)
    assert "/: " in update and "GiB free, below 1e+09 GiB" in update
    assert "missing: No such file or directory" in update
    assert "munge does not work: unmunge: Error: Invalid cred" in update


def test_the_prolog_fails_on_a_sick_gpu_and_passes_without_one(node):
    bin_dir, _, log = node
    assert node_gate.prolog("node2") == 0
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    assert node_gate.prolog("node2") == 1
    assert _updates(log)[0].startswith("update nodename=node2 state=drain reason=pycli prolog: GPU 0")


def test_a_reason_is_one_line_of_at_most_200_characters():
    said = node_gate.reason(node_gate.HEALTH_PREFIX, ["a\nb", "x" * 300])
    assert said.startswith("pycli health: a b; xxx") and len(said) == 200 and said.endswith("...")


def test_the_epilog_stops_what_the_job_left_and_spares_the_rest(node, tmp_path):
    _, _, log = node
    job = str(900000 + os.getpid() % 10000)
    env = {**os.environ, "SLURM_JOB_ID": job}
    left = subprocess.Popen(["sleep", "300"], env=env)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 0.1; done"], env=env)
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, "SLURM_JOB_ID": job + "1"})
    try:
        time.sleep(0.3)
        ran = subprocess.run([sys.executable, "-m", "pycli.node_gate", "epilog", "--node", "node2"], env=env,
                             cwd=PROJECT, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert left.wait(5) == -15 and stubborn.wait(5) == -9
        assert other.poll() is None
        assert _updates(log) == []
    finally:
        for proc in (left, stubborn, other):
            proc.kill()
            proc.wait()


def test_the_epilog_needs_the_job_id(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert node_gate.main(["epilog", "--node", "node2"]) == 2
    assert "no SLURM_JOB_ID" in capsys.readouterr().err


def test_the_gate_runs_from_its_three_files_alone(tmp_path):
    """What the slurm role copies to a node is all the gate needs (no pycli installed there)."""
    package = tmp_path / "pycli"
    package.mkdir()
    for name in ("__init__.py", "gpu_reports.py", "gpu_probe.py", "node_gate.py"):
        (package / name).write_text((PROJECT / "pycli" / name).read_text())
    ran = subprocess.run([sys.executable, "-S", "-m", "pycli.node_gate", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert "health" in ran.stdout
