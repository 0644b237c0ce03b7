"""ddp.py --elastic for real on this machine's CPU: every start goes on from rank 0's checkpoint,
and under torchrun's own agent a killed rank is started again and the job ends by itself."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycli.jobs.datasets import digits_dataset
from pycli.jobs.launch import TORCHRUN_ELASTIC_ENV
from tests.conftest import ROOT

WORKLOADS = ROOT / "workloads"

pytestmark = pytest.mark.slow_torch  # every test here runs ddp.py, most under torchrun


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return digits_dataset(tmp_path_factory.mktemp("cache"))


def _ddp(tmp_path, digits, *extra):
    cmd = [sys.executable, str(WORKLOADS / "ddp.py"), "--data-dir", str(digits), "--threads", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_elastic_start_goes_on_from_the_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path, digits):
    straight = _ddp(tmp_path, digits, "--epochs", "3", "--metrics", "full.jsonl", "--checkpoint", "full.pt")
    assert straight.returncode == 0, straight.stderr
    first = _ddp(tmp_path, digits, "--elastic", "--epochs", "2", "--metrics", "m.jsonl", "--checkpoint", "c.pt")
    assert first.returncode == 0 and "via ddp (elastic, start 1)" in first.stdout and "from epoch 1" in first.stdout
    # A start that died after logging epoch 3 but before its checkpoint: its record goes.
    with (tmp_path / "m.jsonl").open("a") as metrics:
        metrics.write('{"epoch": 3, "train_loss": 9.0}\n')
    again = _ddp(tmp_path, digits, "--elastic", "--epochs", "3", "--metrics", "m.jsonl", "--checkpoint", "c.pt")
    assert again.returncode == 0 and "from epoch 3" in again.stdout, again.stdout + again.stderr
    pieced, full = _records(tmp_path / "m.jsonl"), _records(tmp_path / "full.jsonl")
    assert [r["epoch"] for r in pieced] == [1, 2, 3]
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert pieced[-1][key] == full[-1][key], key
    # All epochs done already (a failure after the last checkpoint): nothing left, and no error.
    done = _ddp(tmp_path, digits, "--elastic", "--epochs", "3", "--metrics", "m.jsonl", "--checkpoint", "c.pt")
    assert done.returncode == 0 and "epoch=" not in done.stdout and len(_records(tmp_path / "m.jsonl")) == 3


def test_an_unreadable_checkpoint_stops_every_rank_in_one_line(tmp_path, digits):
    (tmp_path / "c.pt").write_bytes(b"not a checkpoint")
    proc = _ddp(tmp_path, digits, "--elastic", "--epochs", "2", "--checkpoint", "c.pt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "c.pt is not a checkpoint this workload loads" in proc.stderr


def test_torchrun_starts_a_killed_rank_again_and_the_job_goes_on_from_its_checkpoint(tmp_path, digits):
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
           str(WORKLOADS / "ddp.py"), "--elastic", "--data-dir", str(digits), "--threads", "1", "--epochs", "4",
           "--metrics", "m.jsonl", "--checkpoint", "c.pt"]
    env = {**os.environ, **dict(item.split("=", 1) for item in TORCHRUN_ELASTIC_ENV)}  # as pycli starts it
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    lines, killed = [], None
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line)
            if killed is None and line.startswith("epoch=1 "):
                # Rank 1's process itself (the agent's second child), as a rank that crashes.
                found = subprocess.run(["pgrep", "-f", "-n", f"{WORKLOADS}/ddp.py --elastic"], capture_output=True, text=True)
                killed = int(found.stdout.split()[0])
                subprocess.run(["kill", "-9", str(killed)], check=True)
            assert time.monotonic() < deadline
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    output = "".join(lines)
    assert killed and code == 0, output[-3000:]
    assert "via ddp (elastic, start 2)" in output, output[-3000:]
    got = _records(tmp_path / "m.jsonl")
    assert [r["epoch"] for r in got] == [1, 2, 3, 4]
    restart_from = int(output.split("(elastic, start 2)")[1].split("from epoch ")[1].split()[0])
    finished_before = max(int(line.split()[0].split("=")[1]) for line in output.split("(elastic, start 2)")[0].splitlines()
                          if line.startswith("epoch="))
    assert restart_from == finished_before + 1  # at most the epoch the kill broke into is done again
