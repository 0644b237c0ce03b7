"""`pycli provision --batch` on the session's 2-node cluster, which has no Slurm: the nodes are
drained on pycli's list, a node's jobs are the processes that name a pycli job folder, and the
gate is the GPU probe. (Through Slurm: tests/integration/test_slurm.py.)"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_pycli
from tests.integration.conftest import node_run

pytestmark = pytest.mark.integration
RELEASE = "/tmp/pytest-release-roll-ssh"


def _daemon_json(node: str) -> dict:
    code, out = node_run(node, "cat", "/etc/docker/daemon.json")
    assert code == 0, out
    return json.loads(out)


def _start(*argv: str, runs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pycli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYCLI_RUNS": str(runs)})


def _lines_until(proc: subprocess.Popen, text: str, seen: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no line with {text!r}:\n" + "".join(seen)[-4000:])


def test_a_rolling_change_over_ssh_takes_the_idle_node_first_and_waits_for_the_job_on_the_other(provisioned_cluster,
                                                                                               tmp_path):
    node_run("node1", "rm", "-f", RELEASE)
    job = _start("train", str(ROOT / "tests" / "fixtures" / "wait_for_file.py"), "--np", "1", "-i", str(provisioned_cluster),
                 "--", RELEASE, "300", runs=tmp_path / "job")
    job_seen: list[str] = []
    roll_seen: list[str] = []
    warn = json.dumps({"docker_daemon_options": {"log-level": "warn"}})
    roll = None
    try:
        _lines_until(job, "1 process(es) on node1", job_seen)
        deadline = time.monotonic() + 120
        while node_run("node1", "pgrep", "-f", "[w]ait_for_file.py")[0] != 0:  # the rank runs
            assert time.monotonic() < deadline and job.poll() is None, "".join(job_seen)
            time.sleep(0.5)
        roll = _start("provision", str(provisioned_cluster), "--tags", "docker", "--batch", "1", "-e", warn,
                      runs=tmp_path / "roll")
        _lines_until(roll, "roll: waiting for job(s) to end", roll_seen)
        said = "".join(roll_seen)
        assert "roll: batch 1 of 2: node2 (idle)" in said and "roll: node2 gate: passed: no NVIDIA GPU" in said, said
        assert "roll: batch 2 of 2: node1 (waits for node1: job(s) " in said, said
        # node1 is out of service (pycli's list: no new job goes there) and node2 back; its change is made.
        shown = run_pycli("inventory", "show", str(provisioned_cluster)).stdout
        assert "node1" in shown.split("drained:", 1)[1] and "node2" not in shown.split("drained:", 1)[1], shown
        assert _daemon_json("node2").get("log-level") == "warn" and _daemon_json("node1").get("log-level") != "warn"
        node_run("node1", "touch", RELEASE)
        rest, _ = job.communicate(timeout=300)
        assert job.returncode == 0 and "released" in rest, "".join(job_seen) + rest
        rest, _ = roll.communicate(timeout=900)
        said += rest
        assert roll.returncode == 0, said[-4000:]
        assert "roll: the jobs on node1 have ended" in said and "roll: done: 2 node(s) changed in 2 batch(es)" in said, said
        assert _daemon_json("node1").get("log-level") == "warn"
        assert "drained:" not in run_pycli("inventory", "show", str(provisioned_cluster)).stdout
    finally:
        for proc in (job, roll):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
        node_run("node1", "rm", "-f", RELEASE)
        # The cluster as the other tests expect it: the role's own daemon.json, and nobody drained.
        run_pycli("undrain", "node1", "node2", "-i", str(provisioned_cluster))
        back = run_pycli("provision", str(provisioned_cluster), "--tags", "docker", env={"PYCLI_RUNS": str(tmp_path / "back")},
                         timeout=900)
        assert back.returncode == 0, back.stdout[-3000:]
