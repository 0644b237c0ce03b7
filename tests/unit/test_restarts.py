"""--max-restarts: where and from what a failed job starts again, decided from what the nodes answer."""

import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import torch

from pycli import restarts
from pycli.containers import JobContainer
from pycli.errors import BadInput
from pycli.launch_lines import NodeLayout, checkpoint_path, launch_commands, workload_args
from pycli.nodes import NodeOutput
from tests.unit.test_train_plan import plan


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
