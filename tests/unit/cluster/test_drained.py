"""The drained list: pycli drain/undrain, kept per inventory in the state folder, honoured by
hostfile (and train and bench, through the same `for_jobs`), shown by inventory show."""

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pycli.cluster.drained import drain, drained_file, for_jobs, read_drained, undrain, with_drained
from pycli.cluster.model import Drained, load_cluster
from pycli.core.errors import BadInput
from tests.conftest import run_pycli

INVENTORY = """[nodes]
node1 ansible_host=10.9.0.1 slots=2
node2 ansible_host=10.9.0.2 slots=2
node3 ansible_host=10.9.0.3 slots=2
"""


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("PYCLI_STATE", str(folder))
    return folder


@pytest.fixture
def inventory(tmp_path) -> Path:
    path = tmp_path / "cluster.ini"
    path.write_text(INVENTORY)
    return path


def loaded(inventory: Path):
    return with_drained(load_cluster(inventory))


def test_a_drained_node_is_kept_with_its_reason_and_time_until_undrained(state, inventory):
    when = datetime(2026, 11, 25, 4, 0, 0, tzinfo=timezone.utc)
    (entry,) = drain(loaded(inventory), ["node2"], "compute  0.21 of\nthe median", now=when)
    assert entry == Drained("node2", "compute 0.21 of the median", "2026-11-25T04:00:00Z")  # one line
    assert loaded(inventory).drained == (entry,)
    # Drained again: the new reason, the first time kept.
    (again,) = drain(loaded(inventory), ["node2"], "link 11 % of the median", now=datetime.now(timezone.utc))
    assert again.since == "2026-11-25T04:00:00Z" and again.reason == "link 11 % of the median"
    assert undrain(loaded(inventory), ["node2", "node3"]) == (["node2"], ["node3"])
    assert loaded(inventory).drained == ()
    assert drained_file(loaded(inventory)).parent == state / "drained"


def test_jobs_leave_drained_nodes_out_and_the_launcher_moves_when_it_is_one(state, inventory):
    drain(loaded(inventory), ["node1", "node3"], "ECC errors")
    said = []
    jobs = for_jobs(loaded(inventory), said.append)
    assert [h.name for h in jobs.hosts] == ["node2"] and jobs.launcher == "node2" and jobs.total_slots == 2
    assert said == [f"leaving out drained node1 (ECC errors; since {jobs_since(inventory, 'node1')}), "
                    f"node3 (ECC errors; since {jobs_since(inventory, 'node3')}); 'pycli undrain node1 node3' takes them back"]
    drain(loaded(inventory), ["node2"], "slow")
    with pytest.raises(BadInput, match="every node is drained"):
        for_jobs(loaded(inventory), said.append)


def jobs_since(inventory: Path, node: str) -> str:
    return next(e.since for e in read_drained(loaded(inventory)) if e.node == node)


def test_a_cluster_the_inventory_names_keeps_its_list_when_the_file_moves(state, tmp_path, inventory):
    """The list follows the cluster's name (pycli_cluster_name, or a local cluster's), not the file's
    path: a drained node does not go back to work because its inventory was moved or renamed."""
    drain(loaded(inventory), ["node2"], "PSU swap")  # kept after the path: the file names no cluster yet
    inventory.write_text(INVENTORY + "\n[nodes:vars]\npycli_cluster_name=lab-a\n")
    assert [e.node for e in loaded(inventory).drained] == ["node2"]  # the list kept after the path is read
    drain(loaded(inventory), ["node3"], "fan")  # and moved to the name on its next change
    assert drained_file(loaded(inventory)) == state / "drained" / "lab-a.cluster.json"
    assert [p.name for p in (state / "drained").glob("*.json")] == ["lab-a.cluster.json"]
    moved = tmp_path / "moved" / "renamed.ini"
    moved.parent.mkdir()
    inventory.rename(moved)
    assert [e.node for e in loaded(moved).drained] == ["node2", "node3"]
    local = tmp_path / "local.ini"
    local.write_text(INVENTORY + "\n[nodes:vars]\npycli_local_cluster=lab-b\n")
    assert drained_file(loaded(local)).name == "lab-b.cluster.json" and loaded(local).drained == ()


def test_two_inventories_of_one_name_keep_their_own_lists(state, tmp_path, inventory):
    other = tmp_path / "elsewhere" / "cluster.ini"
    other.parent.mkdir()
    other.write_text(INVENTORY)
    drain(loaded(inventory), ["node2"], "slow")
    assert drained_file(loaded(inventory)) != drained_file(loaded(other)) and loaded(other).drained == ()


@pytest.mark.parametrize(("nodes", "reason", "message"), [
    (["node9"], "slow", "node9: not a host of"),
    ([], "slow", "name the node(s)"),
    (["node1"], "   ", "--reason: say in one line"),
    (["node1"], "x" * 201, "--reason: say in one line"),
])
def test_what_cannot_be_drained_is_bad_input(state, inventory, nodes, reason, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        drain(loaded(inventory), nodes, reason)
    assert not drained_file(loaded(inventory)).exists()


def test_a_damaged_list_is_one_line_naming_it(state, inventory):
    path = drained_file(load_cluster(inventory))
    path.parent.mkdir(parents=True)
    path.write_text('{"drained": [{"node": "node1"}]}')
    with pytest.raises(BadInput, match=f"{path} is not a drained list pycli wrote"):
        loaded(inventory)


def test_the_cli_drains_and_every_command_that_places_ranks_says_what_it_left_out(state, inventory):
    env = {"PYCLI_STATE": str(state)}
    drained = run_pycli("drain", "node2", "-i", str(inventory), "--reason", "link 11 % of the median", env=env)
    assert drained.returncode == 0 and drained.stdout.startswith("drained node2 (link 11 % of the median; since ")
    hostfile = run_pycli("hostfile", str(inventory), env=env)
    assert hostfile.returncode == 0 and hostfile.stdout == "10.9.0.1 slots=2\n10.9.0.3 slots=2\n"  # stdout stays a hostfile
    assert hostfile.stderr.startswith("pycli: leaving out drained node2 (link 11 % of the median;")
    shown = json.loads(run_pycli("inventory", "show", str(inventory), "--json", env=env).stdout)
    assert [h["drained"] and h["drained"]["reason"] for h in shown["hosts"]] == [None, "link 11 % of the median", None]
    table = run_pycli("inventory", "show", str(inventory), env=env).stdout
    assert "DRAINED" in table and "drained: node2 (link 11 % of the median; since" in table
    # Ranks are placed on the nodes left: --np above their slots is refused before anything runs.
    train = run_pycli("train", "mnist", "--np", "6", "-i", str(inventory), env=env)
    assert train.returncode == 2 and "leaving out drained node2" in train.stderr, train.stderr
    bad = run_pycli("drain", "node7", "-i", str(inventory), "--reason", "x", env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "node7: not a host of" in bad.stderr
    back = run_pycli("undrain", "node2", "-i", str(inventory), env=env)
    assert back.returncode == 0 and "undrained node2" in back.stdout
    assert run_pycli("hostfile", str(inventory), env=env).stdout.count("slots=2") == 3


def _drain_each(inventory: str, state: str, nodes: list[str], start: float) -> None:
    """One of two processes draining at once: each node in turn, from the same moment."""
    import os
    import time

    os.environ["PYCLI_STATE"] = state
    cluster = load_cluster(Path(inventory))
    while time.time() < start:
        time.sleep(0.001)
    for node in nodes:
        drain(cluster, [node], f"drained by pid {os.getpid()}")


def test_two_drains_at_once_both_keep_their_nodes(state, tmp_path):
    """A `pycli drain` beside a `check --fence`: each reads, changes and writes the list back; without a
    lock one side's entries are lost."""
    import multiprocessing
    import time

    names = [f"node{i}" for i in range(1, 121)]
    inventory = tmp_path / "big.ini"
    inventory.write_text("[nodes]\n" + "".join(f"{n} ansible_host=10.9.{i // 200}.{i % 200 + 1}\n" for i, n in enumerate(names)))
    start = time.time() + 1.0
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_drain_each, args=(str(inventory), str(state), half, start))
               for half in (names[0::2], names[1::2])]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert sorted(e.node for e in read_drained(loaded(inventory))) == sorted(names)


def test_fencing_drains_every_suspect_even_with_a_reason_longer_than_a_person_may_type(state, inventory):
    """A DCGM result with two warnings makes a reason over MAX_REASON: what is stored is shortened
    (check.json keeps all of it), and no suspect is left undrained."""
    from pycli.cluster.drained import MAX_REASON, fence

    long_why = ("dcgmi diag: Warning: PCIe replay count 12 above the threshold on GPU 0; "
                "Warning: a GPU's memory bandwidth 1.2 TB/s is below 80% of the expected on GPU 3; " * 2)
    fenced = fence(loaded(inventory), {"node1": long_why, "node2": "every link at most 40% of the median link"})
    assert [e.node for e in fenced] == ["node1", "node2"]
    kept = {e.node: e.reason for e in read_drained(loaded(inventory))}
    assert set(kept) == {"node1", "node2"}
    assert len(kept["node1"]) <= MAX_REASON and kept["node1"].startswith("pycli check --deep: dcgmi diag: Warning")
    assert kept["node1"].endswith("(all of it in check.json)")
    assert kept["node2"] == "pycli check --deep: every link at most 40% of the median link"
    with pytest.raises(BadInput, match="--reason"):  # a person's own reason is still held to one short line
        drain(loaded(inventory), ["node3"], long_why)
