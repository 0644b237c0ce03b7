"""--max-restarts: where and from what a failed job starts again, decided from what the nodes answer."""

import functools
import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
import torch

from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import NodeOutput
from pycli.core.errors import BadInput
from pycli.core.paths import WORKLOADS_DIR
from pycli.jobs import restarts
from pycli.jobs.containers import JobContainer
from pycli.jobs.datasets import digits_dataset
from pycli.jobs.launch import NodeLayout, checkpoint_path, launch_commands, remote_data_dir, torchrun_argv, workload_args
from pycli.jobs.request import JobRequest
from pycli.jobs.train import plan_job
from tests.unit.jobs.test_train_plan import plan


def answers(**by_host):
    """What each host says to the probe: an epoch, "none", or None for no answer."""
    def probe(hosts, command):
        assert "checkpoints/last.pt" in command
        return {h.name: NodeOutput(h.name, 255, "", "ssh: connect to host: No route to host") if by_host[h.name] is None
                else NodeOutput(h.name, 0, f"{by_host[h.name]}\n") for h in hosts}
    return probe


def test_a_restart_goes_on_from_the_checkpoint_on_the_new_rank_0(monkeypatch):
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="2", n2="2"))
    job = plan(np=4)
    after = restarts.plan_restart(job)
    assert after.plan.np == 4 and after.plan.hosts == job.hosts and after.epoch == 2 and after.lost == ()
    assert after.plan.resume_on_node == PurePosixPath("/srv/pycli/jobs/j1/checkpoints/last.pt") == checkpoint_path(job)
    args = workload_args(after.plan)
    assert args[args.index("--resume") + 1] == str(checkpoint_path(job))
    line = after.line(1, 2, "rank 3 on n2 was killed by SIGKILL (exit 137) first")
    assert line == ("pycli: restart 1 of 2: rank 3 on n2 was killed by SIGKILL (exit 137) first; going on from epoch 3 "
                    "(checkpoint on n1) with 4 rank(s) on n1, n2")


def test_a_lost_node_is_left_out_when_min_np_allows(monkeypatch):
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="1", n2=None))
    after = restarts.plan_restart(plan(np=4, max_restarts=1, min_np=2))
    assert [h.name for h in after.plan.hosts] == ["n1"] and after.plan.np == 2 and after.lost == ("n2",)
    ((host, line),) = launch_commands(after.plan)
    assert host.name == "n1" and "-np 2 -H 10.9.0.1:2 " in line
    assert after.line(1, 1, "").endswith("with 2 rank(s) on n1; n2 left out (no answer)")


def test_without_min_np_a_lost_node_ends_the_job(monkeypatch):
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="1", n2=None))
    assert restarts.plan_restart(plan(np=4, max_restarts=1)) == (
        "2 slot(s) answer, fewer than --min-np 4 (n2: ssh: connect to host: No route to host)")


def test_a_failure_before_the_first_checkpoint_starts_over(monkeypatch):
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="none", n2="none"))
    after = restarts.plan_restart(plan(np=4, resume=None))
    assert after.epoch == 0 and after.plan.resume_on_node is None and "--resume" not in workload_args(after.plan)
    assert "going on from the start" in after.line(1, 1, "x")


def test_a_restart_names_the_nodes_whose_copy_of_the_checkpoint_is_not_rank_0s(monkeypatch):
    # rank 0's node was stopped as it saved its first checkpoint; n2's first rank had saved its own
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="none", n2="1"))
    after = restarts.plan_restart(plan(np=4, resume=None))
    assert after.epoch == 0 and after.plan.resume_on_node is None and after.differing == (("n2", 1),)
    assert "going on from the start (no checkpoint on n1; n2's copy holds epoch 1) with 4 rank(s)" in after.line(1, 1, "x")


def test_the_probe_reads_the_epoch_of_the_checkpoint_on_the_node(tmp_path):
    layout = NodeLayout(venv=PurePosixPath(sys.prefix), work_dir=PurePosixPath(tmp_path))
    job = plan(np=4)
    job = type(job)(**{**job.__dict__, "layout": layout})
    probe = restarts.checkpoint_probe(job)
    assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout == "none\n"
    path = Path(checkpoint_path(job))
    path.parent.mkdir(parents=True)
    torch.save({"model": {}, "optimizer": {}, "epoch": 2}, path)
    assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout == "2\n"


@pytest.mark.parametrize(("kw", "message"), [
    ({"max_restarts": -1}, "--max-restarts -1: give how often"),
    ({"min_np": 2}, "--min-np says how few ranks a job may go on with; it needs --max-restarts or --elastic"),
    ({"max_restarts": 1, "min_np": 5}, "--min-np 5: give a number of ranks from 1 to --np 4"),
    ({"max_restarts": 1, "min_np": 0}, "--min-np 0: give a number of ranks from 1 to --np 4"),
    ({"max_restarts": 1, "container": JobContainer(image="img")}, "--max-restarts does not work with --docker yet"),
])
def test_restart_options_that_cannot_work_are_one_line(kw, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        plan(np=4, **kw)


# Written by a process of its own: torch.optim loads torch._dynamo, which fails in a pytest process
# where Ansible, imported by earlier tests, has put its own sys.intern in place.
_WRITE_CHECKPOINT = """
import argparse, sys
from pathlib import Path
import torch
from wl_checkpoint import save_checkpoint
from wl_model import DigitNet
path, epoch = Path(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(epoch)
model = DigitNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
save_checkpoint(path, model, optimizer, epoch, argparse.Namespace(epochs=epoch))
"""


def _checkpoint(path: Path, epoch: int) -> None:
    """A checkpoint of `epoch` whose weights are its own (seeded by the epoch), as a node's first rank writes it."""
    subprocess.run([sys.executable, "-c", _WRITE_CHECKPOINT, str(path), str(epoch)], cwd=WORKLOADS_DIR, check=True,
                   capture_output=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow_torch
def test_nodes_whose_checkpoints_hold_different_epochs_all_go_on_from_the_same_one(monkeypatch, tmp_path):
    # A failure during a save: n1 (rank 0's node) wrote epoch 5, n2's first rank was stopped before it wrote its own.
    digits = digits_dataset(tmp_path / "cache")
    folders = {"n1": tmp_path / "n1", "n2": tmp_path / "n2"}
    local = Cluster(hosts=tuple(Host(name=name, address="127.0.0.1", slots=1) for name in folders), launcher="n1")
    request = JobRequest.of(np=2, workload="ddp", launcher=None, controller="gloo", data_dir=digits,
                         script_args=("--epochs", "6", "--threads", "1"), max_restarts=1)
    job = plan_job(local, request, layout=NodeLayout(venv=PurePosixPath(sys.prefix)), job_id="j1")
    job_dir = str(job.job_dir)
    for name, epoch in (("n1", 5), ("n2", 4)):
        _checkpoint(Path(str(checkpoint_path(job)).replace(job_dir, str(folders[name]))), epoch)

    def probe(hosts, command):  # the real probe, each host's folder standing in for the job folder on its own disk
        found = {h.name: subprocess.run(["bash", "-c", command.replace(job_dir, str(folders[h.name]))],
                                        capture_output=True, text=True) for h in hosts}
        return {name: NodeOutput(name, done.returncode, done.stdout, done.stderr) for name, done in found.items()}

    monkeypatch.setattr(restarts, "ssh_probe", probe)
    after = restarts.plan_restart(job)
    assert after.epoch == 5 and after.lost == ()
    assert after.line(1, 1, "x").endswith("going on from epoch 6 (checkpoint on n1, sent to every rank: n2's copy holds epoch 4) "
                                          "with 2 rank(s) on n1, n2")

    # Each node's torchrun as the restart starts it, in its own folder: every rank goes on from n1's checkpoint.
    restart = replace(after.plan, rendezvous_port=_free_port())
    on_node = {str(restart.remote_script): str(WORKLOADS_DIR / "ddp.py"), str(remote_data_dir(restart)): str(digits)}
    nodes = []
    for rank, host in enumerate(restart.hosts):
        words = {**on_node, job_dir: str(folders[host.name])}
        argv = [functools.reduce(lambda w, pair: w.replace(*pair), words.items(), word)
                for word in torchrun_argv(restart, rank)]
        nodes.append(subprocess.Popen(argv, cwd=folders[host.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=90)[0])
    finally:
        for node in nodes:  # SIGTERM first: torchrun stops its ranks, which run in sessions of their own
            if node.poll() is None:
                node.terminate()
        for node in nodes:
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)[-3000:]
    assert "from epoch 6" in outputs[0] and [line.split()[0] for line in outputs[0].splitlines()
                                             if line.startswith("epoch=")] == ["epoch=6"]
    ends = [torch.load(folders[name] / "checkpoints" / "last.pt", weights_only=True) for name in folders]
    assert [end["epoch"] for end in ends] == [6, 6]  # the same epochs on every rank: n2 did not do epoch 5 again
    # The same weights on both nodes after the epoch: both replicas went on from the same bytes.
    assert all(torch.equal(ends[0]["model"][key], ends[1]["model"][key]) for key in ends[0]["model"])


def test_a_resumed_job_that_fails_before_its_first_checkpoint_resumes_from_the_same_file_again(monkeypatch, tmp_path):
    given = tmp_path / "last.pt"
    given.write_bytes(b"a checkpoint")
    monkeypatch.setattr(restarts, "ssh_probe", answers(n1="none", n2="none"))
    job = plan(np=4, resume=given, max_restarts=1)
    after = restarts.plan_restart(job)
    assert after.epoch == 0 and after.plan.resume == given
    args = workload_args(after.plan)
    assert args[args.index("--resume") + 1] == "/srv/pycli/jobs/j1/resume.pt"  # the copy staged with the job
    assert "going on from its --resume checkpoint again (no checkpoint on n1)" in after.line(1, 1, "x")
    # A second failure, after the first restart had gone on from a checkpoint on the nodes: that one again.
    on_node = replace(job, resume=None, resume_on_node=checkpoint_path(job))
    again = restarts.plan_restart(on_node)
    assert again.plan.resume_on_node == checkpoint_path(job)
