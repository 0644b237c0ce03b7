"""How a job's processes end: the first failure named by host, a time limit, a host that stops answering.

The processes are local shells standing in for the ssh sessions (`nodes.ssh_argv`, behind node_argv, is the seam)."""

import time
from types import SimpleNamespace

import pytest

from pycli.cluster import nodes
from pycli.cluster.model import Host
from pycli.core.errors import EXIT_FAILED, BadInput
from pycli.jobs import processes as job_processes


def _run(monkeypatch, lines: dict[str, str], hosts=None, restarts_by_agents=False, **kw):
    hosts = hosts or [Host(name, "10.9.0.1") for name in lines]
    monkeypatch.setattr(job_processes, "launch_commands", lambda plan: [(h, lines[h.name]) for h in hosts if h.name in lines])
    monkeypatch.setattr(nodes, "ssh_argv", lambda host, line, **_: ["sh", "-c", line])
    monkeypatch.setattr(job_processes, "STOP_GRACE_S", 1)
    said = []
    started = time.monotonic()
    plan = SimpleNamespace(hosts=tuple(hosts), restarts_by_agents=restarts_by_agents)
    ended = job_processes.run_processes(plan, said.append, **kw)
    return ended, said, time.monotonic() - started


def test_the_first_host_to_fail_is_named_and_the_others_are_stopped(monkeypatch):
    ended, _, took = _run(monkeypatch, {"node1": "exec sleep 60", "node2": "sleep 0.2; exit 3"})
    assert ended.code != 0 and ended.why == "node2 exited 3 first"
    assert took < 20


def test_a_host_whose_ssh_fails_stopped_answering(monkeypatch):
    ended, _, _ = _run(monkeypatch, {"node1": "exec sleep 60", "node2": "sleep 0.2; exit 255"})
    assert ended.why == "node2 stopped answering (ssh exit 255)"


def test_the_time_limit_stops_the_job_on_every_node(monkeypatch):
    ended, said, took = _run(monkeypatch, {"node1": "exec sleep 60", "node2": "exec sleep 60"}, time_limit_s=1)
    assert ended == job_processes.JobExit(EXIT_FAILED, "its --time-limit of 1 s passed", timed_out=True)
    assert "pycli: the job passed its --time-limit of 1 s; stopping it on every node" in said
    assert took < 20


def test_a_rank_the_launcher_names_is_said_with_its_host_and_signal(monkeypatch):
    # One launcher on node1 for ranks on both nodes, as horovodrun --gloo: its words name the rank.
    hosts = [Host("node1", "10.9.0.1"), Host("node2", "10.9.0.2")]
    launcher = "echo 'Process 1 exit with status code 137.'; exit 1"
    ended, said, _ = _run(monkeypatch, {"node1": launcher}, hosts=hosts)
    assert ended == job_processes.JobExit(1, "rank 1 on node2 was killed by SIGKILL (exit 137) first")
    assert said == ["Process 1 exit with status code 137."]


def test_a_job_that_ends_well_says_nothing(monkeypatch):
    ended, _, _ = _run(monkeypatch, {"node1": "true", "node2": "true"})
    assert ended == job_processes.JobExit(0, "")


@pytest.mark.parametrize("limit", [0, -5])
def test_a_time_limit_must_be_positive(limit):
    from tests.unit.jobs.test_train_plan import plan

    with pytest.raises(BadInput, match="--time-limit"):
        plan(time_limit_s=limit)


def test_under_torchrun_elastic_a_lost_node_is_said_and_the_first_node_s_agent_goes_on(monkeypatch):
    lines = {"node1": "sleep 1.5; exit 0", "node2": "sleep 0.2; exit 255", "node3": "sleep 0.2; exit 1"}
    ended, said, _ = _run(monkeypatch, lines, restarts_by_agents=True)
    assert ended == job_processes.JobExit(0, "")  # the job is what the rendezvous host's agent says
    assert "pycli: node2 stopped answering (ssh exit 255); torchrun's agents go on without it" in said
    assert "pycli: node3 exited 1; torchrun's agents go on without it" in said


def test_under_torchrun_elastic_the_first_node_s_failure_ends_the_job(monkeypatch):
    ended, _, took = _run(monkeypatch, {"node1": "sleep 0.2; exit 1", "node2": "exec sleep 60"}, restarts_by_agents=True)
    assert ended.code == 1 and ended.why == "node1 exited 1 first"
    assert took < 20  # the other agents were stopped, not waited for
