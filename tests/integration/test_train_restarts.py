"""`pycli train --max-restarts`: a killed rank or a lost node, and the job finishes by itself
(the shared `provisioned_cluster`; node2 is brought back after the test that kills it)."""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.test_node_down import _bring_back, _container
from tests.integration.test_train import FAST, records, results_in, results_of, train

pytestmark = pytest.mark.integration
# Small batches make epochs long enough that a kill after epoch 1 lands in a later one.
WORK = ["--epochs", "4", "--batch-size", "16", *FAST]


def run_and_kill(inventory, *args, after: str, kill):
    """Start `pycli train`, call kill() once a line holding `after` is printed; what it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "pycli", "train", "-i", str(inventory), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, killed = [], False
    try:
        for line in proc.stdout:
            lines.append(line)
            if not killed and after in line:
                kill()
                killed = True
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines)
    assert killed, output[-3000:]
    return proc.returncode, output


def test_a_killed_rank_restarts_from_the_newest_checkpoint_and_ends_as_an_uninterrupted_run(provisioned_cluster):
    straight = train(provisioned_cluster, "mnist", "--np", "2", "--", *WORK)
    assert straight.returncode == 0, straight.stdout[-3000:]

    def kill_rank_on_node2():  # the rank's Python process itself, not the shell around it
        code, out = _container("node2").exec_run(
            ["bash", "-c", "pids=$(ps -eo pid=,comm=,args= | awk '$2 ~ /^python/ && /[/]srv[/]pycli[/]jobs[/].*mnist.py/ "
             "{print $1}'); [ -n \"$pids\" ] && kill -9 $pids && echo killed"])
        assert code == 0 and b"killed" in out, out

    code, output = run_and_kill(provisioned_cluster, "mnist", "--np", "2", "--max-restarts", "1", "--", *WORK,
                                after="epoch=1 ", kill=kill_rank_on_node2)
    assert code == 0, output[-4000:]
    # horovodrun starts rank 1 over ssh, which says 255 for a rank killed by a signal.
    restart = re.search(r"pycli: restart 1 of 1: rank 1 on node2 ended with exit 255 \(ssh's: the rank was killed by a "
                        r"signal, or the node stopped answering\) first; "
                        r"going on from epoch (\d) \(checkpoint on node1\) with 2 rank\(s\) on node1, node2", output)
    assert restart, output[-4000:]
    finished_before = max(int(n) for n in re.findall(r"epoch=(\d) ", output[:restart.start()]))
    assert int(restart[1]) == finished_before + 1  # only the epoch the kill broke into is done again
    pieced, expected = records(results_in(output)), records(results_of(straight))
    assert [r["epoch"] for r in pieced] == [1, 2, 3, 4]
    for key in ("train_loss", "val_loss", "val_accuracy"):  # the same seed, data order and weights
        assert pieced[-1][key] == pytest.approx(expected[-1][key], rel=1e-5), key


def test_a_lost_node_lets_torchrun_finish_on_the_node_left(provisioned_cluster):
    try:
        code, output = run_and_kill(provisioned_cluster, "ddp", "--np", "2", "--max-restarts", "1", "--min-np", "1",
                                    "--", *WORK, after="epoch=1 ", kill=lambda: _container("node2").kill())
    finally:
        _bring_back(provisioned_cluster)
    assert code == 0, output[-4000:]
    assert re.search(r"pycli: restart 1 of 1: .*; going on from epoch \d \(checkpoint on node1\) with 1 rank\(s\) "
                     r"on node1; node2 left out \(no answer\)", output), output[-4000:]
    got = records(results_in(output))
    assert [r["epoch"] for r in got] == [1, 2, 3, 4] and got[-1]["ranks"] == 1
    assert json.dumps(got)  # the metrics came back from node1
