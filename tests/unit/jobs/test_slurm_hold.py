"""pycli.jobs.slurm_hold: which nodes `pycli check` holds in Slurm, checks unheld, or leaves to
their jobs; and the salloc and scancel lines it holds and releases them with."""

from __future__ import annotations

import pytest

from pycli.cluster.model import Cluster, Host
from pycli.core.errors import PycliError
from pycli.jobs.slurm_hold import plan_hold
from pycli.cluster import slurm_nodes
from pycli.jobs import slurm

HOSTS = tuple(Host(name=f"node{i}", address=f"10.0.0.{i}", slots=4) for i in (1, 2, 3, 4))
CLUSTER = Cluster(hosts=HOSTS, launcher="node1", slurm_controller="node1")


def _states(*lines: str) -> dict[str, slurm_nodes.NodeState]:
    return slurm_nodes.parse_sinfo_nodes("".join(line + "\n" for line in lines))


def _jobs(*lines: str) -> list[slurm.QueuedJob]:
    return slurm.parse_squeue("".join(line + "\n" for line in lines))


def test_idle_nodes_are_held_busy_ones_left_alone_and_drained_ones_checked_unheld():
    states = _states("node1|mixed|gpu:8|none", "node2|idle|gpu:8|none", "node3|drained|gpu:8|pycli: ecc",
                     "node4|draining|gpu:8|fan")
    jobs = _jobs("12|ana|RUNNING|None|1|node1|node1|train", "13|ben|RUNNING|None|1|node4|node4|eval",
                 "14|ben|PENDING|Resources|0|||big")
    hold = plan_hold(CLUSTER, states, jobs)
    assert hold.held == ("node2",) and hold.unheld == ("node3",)
    assert hold.busy == {"node1": ["12"], "node4": ["13"]}
    # The gates see node2 and node3 only; the allreduce job starts from the first of them.
    assert [h.name for h in hold.cluster.hosts] == ["node2", "node3"] and hold.cluster.launcher == "node2"
    assert hold.as_json() == {"job_id": "", "held": ["node2"], "unheld": ["node3"], "busy": {"node1": ["12"], "node4": ["13"]},
                              "unknown": [], "slurm_error": ""}


def test_a_node_squeue_names_is_busy_whatever_sinfo_said_a_moment_before():
    hold = plan_hold(CLUSTER, _states(*(f"node{i}|idle|(null)|none" for i in (1, 2, 3, 4))),
                     _jobs("20|ana|RUNNING|None|2|node[3-4]|node3|train"))
    assert hold.held == ("node1", "node2") and hold.busy == {"node3": ["20"], "node4": ["20"]}
    assert hold.cluster.launcher == "node1"


def test_nothing_to_check_where_every_node_runs_a_job_is_one_line():
    states = _states(*(f"node{i}|allocated|(null)|none" for i in (1, 2, 3, 4)))
    with pytest.raises(PycliError) as caught:
        plan_hold(CLUSTER, states, _jobs("30|ana|RUNNING|None|4|node[1-4]|node1|train"))
    said = str(caught.value)
    assert said.startswith("every node runs a Slurm job: nothing to check") and "node4: job 30" in said and "\n" not in said


def test_node_states_busy_and_available():
    states = _states("n1|mixed*|(null)|none", "n2|idle~|(null)|none", "n3|completing|(null)|none", "n4|allocated+drain|(null)|x")
    assert [states[n].busy for n in ("n1", "n2", "n3", "n4")] == [True, False, True, True]
    assert states["n2"].base == "idle" and not states["n1"].available


def test_the_hold_is_one_exclusive_allocation_without_a_shell_of_exactly_the_idle_nodes():
    line = slurm.hold_command(["node2", "node3"], "pycli-check-20261204-050000")
    assert line == ("salloc --no-shell --exclusive --nodes=2 --nodelist=node2,node3 --job-name=pycli-check-20261204-050000 "
                    "--time=1:00:00 --immediate=30 '--comment=pycli check: the nodes it measures, held'")
    said = "salloc: Granted job allocation 11\nsalloc: Waiting for resource configuration\nsalloc: Nodes node1 are ready for job\n"
    assert slurm.parse_granted(said) == "11"
    # What salloc says where the nodes are not free within --immediate (Slurm 22.05).
    refused = ("salloc: Pending job allocation 13\nsalloc: job 13 queued and waiting for resources\n"
               "salloc: error: Unable to allocate resources: Connection timed out\n")
    assert slurm.parse_granted(refused) is None
    assert slurm.cancel_by_name_command("pycli-check-x") == "scancel --name=pycli-check-x"


def test_a_node_slurm_does_not_know_is_checked_unheld_and_named():
    hold = plan_hold(CLUSTER, _states("node1|idle|(null)|none", "node2|idle|(null)|none", "node3|idle|(null)|none"), [])
    assert hold.held == ("node1", "node2", "node3") and hold.unheld == ("node4",) and hold.unknown == ("node4",)


def _ssh_each(monkeypatch, answers: dict[str, tuple[int, str]]) -> list[str]:
    """ssh_each of pycli.jobs.slurm_hold: each host answers (rc, stdout); the hosts asked, in order."""
    from pycli.cluster import slurm_state
    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import slurm_hold

    asked: list[str] = []

    def ssh_each(commands, timeout_s=0, shared=False):
        out = {}
        for host, _ in commands:
            asked.append(host.name)
            rc, text = answers[host.name]
            out[host.name] = NodeOutput(host.name, rc, text if rc == 0 else "", "" if rc == 0 else text)
        return out

    monkeypatch.setattr(slurm_hold, "ssh_each", ssh_each)
    monkeypatch.setattr(slurm_state, "ssh_each", ssh_each)
    return asked


def test_slurm_is_asked_on_the_controller_or_another_node_where_the_launcher_does_not_answer(monkeypatch):
    from pycli.cluster.slurm_state import ask_slurm

    cluster = Cluster(hosts=HOSTS, launcher="node2", slurm_controller="node3")
    asked = _ssh_each(monkeypatch, {"node2": (255, "ssh: connect to host 10.0.0.2 port 22: No route to host"),
                                    "node3": (255, "ssh: connect to host 10.0.0.3 port 22: Connection refused"),
                                    "node1": (0, "answer"), "node4": (0, "not asked")})
    assert ask_slurm(cluster, "squeue") == (HOSTS[0], "answer") and asked == ["node2", "node3", "node1"]
    # slurmctld down: Slurm's own failure is the same on every node, said at once.
    asked = _ssh_each(monkeypatch, {"node2": (1, "squeue: error: Unable to contact slurm controller (connect failure)")})
    with pytest.raises(PycliError, match=r"^on node2: squeue: error: Unable to contact slurm controller"):
        ask_slurm(cluster, "squeue")
    assert asked == ["node2"]


def test_where_slurm_cannot_be_asked_every_node_is_checked_unheld_and_the_check_fails(monkeypatch):
    from pycli.jobs.slurm_hold import held_for_check

    _ssh_each(monkeypatch, {"node1": (1, "squeue: error: Unable to contact slurm controller (connect failure)")})
    said: list[str] = []
    with held_for_check(CLUSTER, "pycli-check-x", said.append) as hold:
        assert hold.unheld == ("node1", "node2", "node3", "node4") and hold.held == () and not hold.job_ids
        assert "Unable to contact slurm controller" in hold.slurm_error
    assert said[0].startswith("pycli: Slurm cannot be asked (on node1: squeue: error: Unable to contact slurm controller")
    assert said[0].endswith("every node measured without holding it, a job may run beside the check, and the check fails")


def test_a_closed_terminal_releases_the_hold_at_once(monkeypatch):
    import os
    import signal

    from pycli.cluster import slurm_state
    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import slurm_hold

    asked: list[str] = []

    def ssh_each(commands, timeout_s=0, shared=False):
        out = {}
        for host, command in commands:
            asked.append(command)
            # squeue (no job) and sinfo (every node idle) in one answer, as held_for_check asks them.
            said = "@@pycli-sinfo\n" + "".join(f"node{i}|idle|(null)|none\n" for i in (1, 2, 3, 4)) \
                if command.startswith("squeue") else ""
            out[host.name] = NodeOutput(host.name, 0, said, "salloc: Granted job allocation 77\n"
                                        if command.startswith("salloc") else "")
        return out

    monkeypatch.setattr(slurm_hold, "ssh_each", ssh_each)
    monkeypatch.setattr(slurm_state, "ssh_each", ssh_each)
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(SystemExit) as ended:
        with slurm_hold.held_for_check(CLUSTER, "pycli-check-x", lambda line: None):
            os.kill(os.getpid(), signal.SIGHUP)
    assert ended.value.code == 128 + signal.SIGHUP and asked[-1] == "scancel 77"
    assert signal.getsignal(signal.SIGHUP) == before


def test_idle_nodes_in_different_partitions_are_held_one_allocation_a_partition(monkeypatch):
    """An allocation is of one partition: node3 and node4 are only in `cpu`, node1 and node2 only in
    `gpu` (the default), so one salloc without --partition could not hold them all."""
    from pycli.cluster import slurm_state
    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import slurm_hold

    assert slurm_nodes.parse_node_partitions("node1|gpu\nnode1|all\nnode3|cpu\n\n") == {"node1": ("gpu", "all"),
                                                                                          "node3": ("cpu",)}
    assert slurm_nodes.by_partition(["node1", "node2", "node3"], {"node1": ("gpu", "all"), "node2": ("all",),
                                                                  "node3": ("cpu", "all")}) == [("all", ["node1", "node2", "node3"])]
    assert slurm_nodes.by_partition(["node1", "node3", "node5"], {"node1": ("gpu",), "node3": ("cpu",)}) == [
        ("gpu", ["node1"]), ("cpu", ["node3"]), (None, ["node5"])]
    asked: list[str] = []
    granted = iter(("41", "42"))

    def ssh_each(commands, timeout_s=0, shared=False):
        out = {}
        for host, command in commands:
            asked.append(command)
            said = ("@@pycli-sinfo\n" + "".join(f"node{i}|idle|(null)|none\n" for i in (1, 2, 3, 4)) + "@@pycli-sinfo\n"
                    + "".join(f"node{i}|{'gpu' if i < 3 else 'cpu'}\n" for i in (1, 2, 3, 4))) if command.startswith("squeue") else ""
            out[host.name] = NodeOutput(host.name, 0, said, f"salloc: Granted job allocation {next(granted)}\n"
                                        if command.startswith("salloc") else "")
        return out

    monkeypatch.setattr(slurm_hold, "ssh_each", ssh_each)
    monkeypatch.setattr(slurm_state, "ssh_each", ssh_each)
    said: list[str] = []
    with slurm_hold.held_for_check(CLUSTER, "pycli-check-x", said.append) as hold:
        assert hold.held == ("node1", "node2", "node3", "node4") and hold.job_ids == ("41", "42")
        assert hold.as_json()["job_id"] == "41,42"
    sallocs = [command for command in asked if command.startswith("salloc")]
    assert [("--partition=gpu" in c and "--nodelist=node1,node2" in c, "--partition=cpu" in c and "--nodelist=node3,node4" in c)
            for c in sallocs] == [(True, False), (False, True)]
    assert said[-1] == ("pycli: Slurm: node1, node2, node3, node4 held for this check (jobs 41, 42, one a partition, exclusive; "
                        "released when it ends)")
    assert asked[-1] == "scancel 41; scancel 42"
