"""`pycli train` on this machine as a local host (`inventory new --local`): no SSH, no containers.

The venv is this project's own (torch on CPU; Horovod is not in it, so torchrun's workloads run:
ddp and synthetic). Each job stages into, and is swept from, a work folder of the test's own;
after each, no process names that folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pycli.jobs.datasets import digits_dataset
from tests.conftest import PYCLI, ROOT

pytestmark = pytest.mark.slow_torch
WORK = ["--threads", "1"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return digits_dataset(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def local(tmp_path) -> tuple[Path, Path]:
    """A local inventory of this machine with 2 slots, jobs in the test's folder: (inventory, work folder)."""
    inventory, work = tmp_path / "local.ini", tmp_path / "work"
    made = subprocess.run([*PYCLI, "inventory", "new", "-o", str(inventory), "--local", "--slots", "2",
                           "--venv", str(ROOT / ".venv"), "--work-dir", str(work)], capture_output=True, text=True, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return inventory, work


def _start(inventory: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*PYCLI, "train", "-i", str(inventory), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _run(inventory: Path, *args: str, when: str | None = None, then=None) -> tuple[int, str]:
    """`pycli train` to its end; then(proc) once a line holding `when` is printed."""
    proc = _start(inventory, *args)
    assert proc.stdout is not None
    lines, done = [], when is None
    try:
        for line in proc.stdout:
            lines.append(line)
            if not done and when in line:
                then(proc)
                done = True
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines)
    assert done, output[-3000:]
    return proc.returncode, output


def _left(work: Path) -> str:
    """Processes whose command lines name the work folder (a job's ranks and launchers)."""
    return subprocess.run(["pgrep", "-af", str(work)], capture_output=True, text=True).stdout


def _results(output: str) -> Path:
    return Path(re.search(r"results in (\S+)", output)[1])


def _records(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]


def test_ddp_runs_on_the_local_host_and_its_results_come_back(local, digits):
    inventory, work = local
    code, output = _run(inventory, "ddp", "--np", "2", "--data-dir", str(digits), "--", "--epochs", "2", *WORK)
    assert code == 0, output[-3000:]
    assert "2 process(es) on localhost via torchrun" in output
    assert re.search(r"^epoch=2 ranks=2 launcher=ddp device=cpu ", output, re.M), output[-3000:]
    results = _results(output)
    got = _records(results)
    assert [r["epoch"] for r in got] == [1, 2] and all(r["ranks"] == 2 for r in got)
    assert (results / "checkpoints" / "last.pt").is_file()
    assert list((work / "jobs").iterdir()) and (work / "files").is_dir()  # staged into the inventory's work folder
    assert _left(work) == ""


def test_the_default_job_learns_as_well_on_8_ranks_as_on_2(tmp_path, digits):
    """`pycli train --np N` with no workload arguments: the digit training's default batch is one
    global batch shared out between the ranks, so 8 ranks take as many steps an epoch as 2 and
    learn as well (with 64 samples per rank, 8 ranks took 3 steps an epoch and ended near 0.57).
    ddp, as Horovod is not here: mnist.py runs the same loop with the same defaults."""
    inventory = tmp_path / "local.ini"
    made = subprocess.run([*PYCLI, "inventory", "new", "-o", str(inventory), "--local", "--slots", "8",
                           "--venv", str(ROOT / ".venv"), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    accuracy, outputs = {}, {}
    for np in (2, 8):
        code, outputs[np] = _run(inventory, "ddp", "--np", str(np), "--data-dir", str(digits))
        assert code == 0, outputs[np][-3000:]
        (*_, last) = _records(_results(outputs[np]))
        assert last["epoch"] == 5 and last["ranks"] == np
        accuracy[np] = last["val_accuracy"]
    assert accuracy[8] > 0.75 and accuracy[8] >= accuracy[2] - 0.05, accuracy
    for np in (2, 8):  # rank 0 says the batch each rank takes
        assert f"batch {64 // np} per rank (64 in all)" in outputs[np], outputs[np][-3000:]


def test_synthetic_under_torchrun_runs_on_the_local_host(local):
    inventory, work = local
    code, output = _run(inventory, "synthetic", "--launcher", "torchrun", "--np", "2", "--",
                        "--num-iters", "2", "--num-batches-per-iter", "2", "--image-size", "32", "--width", "8", *WORK)
    assert code == 0, output[-3000:]
    (record,) = _records(_results(output))
    assert record["ranks"] == 2 and record["total_img_per_s"] > 0, record
    assert _left(work) == ""


def test_ctrl_c_ends_every_rank_on_the_local_host(local, digits):
    inventory, work = local
    seen: list[str] = []

    def interrupt(proc: subprocess.Popen) -> None:
        seen.append(_left(work))  # the ranks were running
        proc.send_signal(signal.SIGINT)  # as Ctrl-C in pycli's terminal

    code, output = _run(inventory, "ddp", "--np", "2", "--data-dir", str(digits), "--", "--epochs", "50", *WORK,
                        when="epoch=1 ", then=interrupt)
    assert code == 130, output[-3000:]
    assert seen[0].count("ddp.py") >= 2, seen  # torchrun and its ranks named the job's folder
    assert "pycli: interrupting the job on every node" in output
    assert "KeyboardInterrupt" in output  # SIGINT reached the ranks themselves, not only a SIGKILL
    assert "job interrupted after" in output and "no process of it is left on any node" in output
    assert "epoch=50 " not in output and _left(work) == ""


def test_the_timeout_stops_the_job_on_the_local_host(local, digits):
    inventory, work = local
    started = time.monotonic()
    code, output = _run(inventory, "ddp", "--np", "2", "--data-dir", str(digits), "--time-limit", "6", "--",
                        "--epochs", "50", *WORK)
    assert code == 1, output[-3000:]
    assert "pycli: the job passed its --time-limit of 6 s; stopping it on every node" in output
    assert "its --time-limit of 6 s passed" in output and "epoch=50 " not in output
    assert time.monotonic() - started < 60 and _left(work) == ""


def test_a_killed_rank_on_the_local_host_starts_again_from_its_checkpoint(local, digits):
    inventory, work = local

    def kill_a_rank(_proc: subprocess.Popen) -> None:
        # A rank's Python process itself (torchrun's own names the script too, under another name).
        ps = subprocess.run(["ps", "-ww", "-eo", "pid=,comm=,args="], capture_output=True, text=True).stdout
        ranks = [int(line.split()[0]) for line in ps.splitlines()
                 if line.split()[1].startswith("python") and f"{work}/jobs/" in line and "ddp.py" in line]
        assert len(ranks) == 2, ps
        os.kill(ranks[-1], signal.SIGKILL)

    code, output = _run(inventory, "ddp", "--np", "2", "--data-dir", str(digits), "--max-restarts", "1", "--",
                        "--epochs", "3", *WORK, when="epoch=1 ", then=kill_a_rank)
    assert code == 0, output[-4000:]
    restart = re.search(r"pycli: restart 1 of 1: rank \d on localhost was killed by SIGKILL first; going on from "
                        r"epoch (\d) \(checkpoint on localhost\) with 2 rank\(s\) on localhost\n", output)
    assert restart, output[-4000:]
    finished_before = max(int(n) for n in re.findall(r"^epoch=(\d) ", output[:restart.start()], re.M))
    assert int(restart[1]) == finished_before + 1
    assert [r["epoch"] for r in _records(_results(output))] == [1, 2, 3]
    assert _left(work) == ""

