"""pycli.health.slurm_hold: which nodes `pycli check` holds in Slurm, checks unheld, or leaves to
their jobs; and the salloc and scancel lines it holds and releases them with."""

from __future__ import annotations

import pytest

from pycli.cluster.model import Cluster, Host
from pycli.core.errors import PycliError
from pycli.health.slurm_hold import plan_hold
from pycli.jobs import slurm, slurm_nodes

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
    assert hold.as_json() == {"job_id": "", "held": ["node2"], "unheld": ["node3"], "busy": {"node1": ["12"], "node4": ["13"]}}


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
