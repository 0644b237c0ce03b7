"""Artifacts passed on from node to node (role artifact_cache): the fan-out plan
(plugins/filter/fanout.py: rounds, sources, alternates, groups) and files/fanout-pull.sh, run
here with bash through `runuser` and `ssh` stand-ins that serve each peer's copy from a folder."""

import hashlib
import importlib.util
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PLUGINS, ROOT

ROLE = ROOT / "roles" / "artifact_cache"
PULL = ROLE / "files" / "fanout-pull.sh"

_spec = importlib.util.spec_from_file_location("artifact_cache_fanout", PLUGINS / "filter" / "fanout.py")
fanout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fanout)


def nodes(count: int) -> list[str]:
    return [f"node{i}" for i in range(1, count + 1)]


def held_after(plan: dict, holders=()) -> dict[str, int]:
    """The round after which each node holds the artifact (-1: before the fan-out)."""
    rounds = {node: -1 for node in holders}
    rounds.update({node: entry["round"] for node, entry in plan["nodes"].items()})
    return rounds


@pytest.mark.parametrize("count", [1, 2, 3, 16, 100, 512])
def test_the_controller_sends_once_and_the_holders_double_each_round(count):
    plan = fanout.fanout_plan(nodes(count))
    assert sorted(plan["nodes"]) == sorted(nodes(count))
    from_controller = [n for n, e in plan["nodes"].items() if e["source"] == "controller"]
    assert from_controller == ["node1"] and plan["nodes"]["node1"]["round"] == 0
    assert plan["rounds"] == math.ceil(math.log2(count))
    held = held_after(plan)
    for node, entry in plan["nodes"].items():
        if entry["source"] != "controller":  # a source got it in an earlier round
            assert held[entry["source"]] < entry["round"], (node, entry)
    for round_ in range(1, plan["rounds"] + 1):
        pulling = [e for e in plan["nodes"].values() if e["round"] == round_]
        sources = [e["source"] for e in pulling]
        assert len(sources) == len(set(sources))  # a holder serves one node a round
        assert len(pulling) == min(2 ** (round_ - 1), count - 2 ** (round_ - 1))


def test_512_nodes_take_nine_rounds_and_one_controller_copy():
    plan = fanout.fanout_plan(nodes(512))
    assert plan["rounds"] == 9
    assert sum(e["source"] == "controller" for e in plan["nodes"].values()) == 1


def test_nodes_that_hold_it_serve_and_the_controller_sends_nothing():
    plan = fanout.fanout_plan(["node2", "node3", "node4"], holders=["node1", "node5"])
    assert "node1" not in plan["nodes"] and "node5" not in plan["nodes"]
    assert all(e["source"] != "controller" for e in plan["nodes"].values())
    assert plan["nodes"]["node2"] == {"round": 1, "source": "node1", "alternates": ["node5"]}
    assert plan["nodes"]["node3"] == {"round": 1, "source": "node5", "alternates": ["node1"]}
    assert plan["nodes"]["node4"]["round"] == 2 and plan["rounds"] == 2


def test_several_seeds_shorten_the_fan_out():
    plan = fanout.fanout_plan(nodes(16), seeds=4)
    assert sum(e["source"] == "controller" for e in plan["nodes"].values()) == 4
    assert plan["rounds"] == 2


def test_alternates_are_other_nodes_that_held_it_before_the_round():
    """When a source dies mid-fan-out, the nodes it was to serve try holders from earlier
    rounds: they lose one try, not their round."""
    plan = fanout.fanout_plan(nodes(64), alternates=2)
    held = held_after(plan)
    for node, entry in plan["nodes"].items():
        assert entry["source"] not in entry["alternates"]
        assert len(entry["alternates"]) == min(2, sum(1 for r in held.values() if r < entry["round"]) - 1) or entry["round"] == 0
        assert all(held[alt] < entry["round"] for alt in entry["alternates"])
    assert plan["nodes"]["node2"]["alternates"] == []  # round 1: the seed is the only holder
    assert all(not e["alternates"] for e in fanout.fanout_plan(nodes(8), alternates=0)["nodes"].values())


def test_without_peers_every_node_gets_it_from_the_controller():
    plan = fanout.fanout_plan(nodes(5), peers=False)
    assert plan["rounds"] == 0 and all(e == {"round": 0, "source": "controller", "alternates": []}
                                       for e in plan["nodes"].values())


@pytest.mark.parametrize("kwargs", [{"seeds": 0}, {"alternates": -1}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        fanout.fanout_plan(nodes(3), **kwargs)


def test_plans_group_nodes_by_artifact_and_cluster():
    pushes = [
        {"host": "a1", "entry": "/c/ompi-debian", "sha256": "1" * 64, "holds": "False", "cluster": "lab"},
        {"host": "a2", "entry": "/c/ompi-debian", "sha256": "1" * 64, "holds": "True", "cluster": "lab"},
        {"host": "a3", "entry": "/c/ompi-debian", "sha256": "1" * 64, "holds": False, "cluster": "lab"},
        {"host": "b1", "entry": "/c/ompi-ubuntu", "sha256": "2" * 64, "holds": False, "cluster": "lab"},
        {"host": "b2", "entry": "/c/ompi-ubuntu", "sha256": "2" * 64, "holds": False, "cluster": "lab"},
        {"host": "c1", "entry": "/c/ompi-debian", "sha256": "1" * 64, "holds": False, "cluster": ""},
        {},  # a node done with an earlier artifact
    ]
    plans = fanout.fanout_plans(pushes)
    assert set(plans["nodes"]) == {"a1", "a3", "b1", "b2", "c1"}
    assert {plans["nodes"][n]["source"] for n in ("a1", "a3")} == {"a2"}  # the holder serves, in two rounds
    assert plans["nodes"]["b1"]["source"] == "controller" and plans["nodes"]["b2"]["source"] == "b1"
    assert plans["nodes"]["c1"]["source"] == "controller"  # in no trust: never from a peer
    assert plans["rounds"] == 2


# --- files/fanout-pull.sh --------------------------------------------------------------------


@pytest.fixture
def peers(tmp_path, monkeypatch):
    """Stand-ins: `runuser -u USER -- CMD` runs CMD; `ssh ... -- SOURCE cat -- FILE` prints
    tmp_path/peers/SOURCE/<FILE's name>, "No such file" when that is missing, cannot
    reach a SOURCE without a folder, and never ends for one whose folder holds `frozen`.
    Returns (serve(source, data), calls())."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "peers").mkdir()
    (bin_dir / "runuser").write_text('#!/bin/bash\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    (bin_dir / "ssh").write_text(f"""#!/bin/bash
while [ "$1" != "--" ]; do shift; done
source=$2 file=$5
echo "$source" >> {tmp_path}/calls
[ -d {tmp_path}/peers/"$source" ] || {{ echo "ssh: connect to host $source port 22: Connection refused" >&2; exit 255; }}
[ -e {tmp_path}/peers/"$source"/frozen ] && exec sleep 600
cat {tmp_path}/peers/"$source"/"$(basename "$file")" 2>/dev/null || {{ echo "cat: $file: No such file or directory" >&2; exit 1; }}
""")
    for tool in ("runuser", "ssh"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def serve(source: str, data: bytes | None) -> None:
        (tmp_path / "peers" / source).mkdir(exist_ok=True)
        if data is not None:
            (tmp_path / "peers" / source / "openmpi.tar.gz").write_bytes(data)

    def calls() -> list[str]:
        log = tmp_path / "calls"
        return log.read_text().split() if log.exists() else []

    return serve, calls


def pull(dest: Path, sha256: str, *sources: str, seconds: int = 30) -> subprocess.CompletedProcess:
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    return subprocess.run(["bash", str(PULL), str(dest), sha256, user, str(seconds), *sources], capture_output=True,
                          text=True, timeout=60)


GOOD = b"the packed Open MPI prefix"
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()


def test_a_copy_is_pulled_from_the_first_source_that_has_it_whole(tmp_path, peers):
    serve, calls = peers
    serve("10.0.0.1", GOOD)
    dest = tmp_path / "node" / "artifacts" / "openmpi.tar.gz"
    proc = pull(dest, GOOD_SHA, "10.0.0.1", "10.0.0.2")
    assert proc.returncode == 0 and proc.stdout.startswith("pulled from 10.0.0.1"), proc
    assert dest.read_bytes() == GOOD and oct(dest.stat().st_mode & 0o777) == "0o644"
    assert calls() == ["10.0.0.1"] and os.listdir(dest.parent) == ["openmpi.tar.gz"]


def test_a_damaged_copy_is_never_kept_and_the_next_source_serves(tmp_path, peers):
    serve, calls = peers
    serve("10.0.0.1", GOOD[:-3] + b"xyz")
    serve("10.0.0.2", None)  # up, without the file
    serve("10.0.0.3", GOOD)
    dest = tmp_path / "openmpi.tar.gz"
    proc = pull(dest, GOOD_SHA, "10.0.0.4", "10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert proc.returncode == 0 and proc.stdout.startswith("pulled from 10.0.0.3"), proc
    assert dest.read_bytes() == GOOD and calls() == ["10.0.0.4", "10.0.0.1", "10.0.0.2", "10.0.0.3"]
    reasons = proc.stderr.splitlines()
    assert reasons[0] == "10.0.0.4: ssh: connect to host 10.0.0.4 port 22: Connection refused"
    bad_sha = hashlib.sha256(GOOD[:-3] + b"xyz").hexdigest()
    assert reasons[1] == f"10.0.0.1: its copy has sha256 {bad_sha}, not {GOOD_SHA}"
    assert reasons[2].startswith("10.0.0.2: cat: ") and "No such file" in reasons[2]


def test_when_no_source_can_serve_the_node_keeps_what_it_had_and_says_why(tmp_path, peers):
    serve, _ = peers
    serve("10.0.0.1", b"something else")
    dest = tmp_path / "openmpi.tar.gz"
    dest.write_bytes(b"old")
    proc = pull(dest, GOOD_SHA, "10.0.0.1", "10.0.0.9")
    assert proc.returncode == 1 and proc.stdout == ""
    assert [line.split(":")[0] for line in proc.stderr.splitlines()] == ["10.0.0.1", "10.0.0.9"]
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("openmpi")) == ["openmpi.tar.gz"]


def test_a_source_that_never_finishes_costs_its_time_limit_and_the_next_serves(tmp_path, peers):
    """A peer that answers but never ends the transfer (keepalives leave a frozen one sooner)."""
    import time

    serve, calls = peers
    serve("10.0.0.1", GOOD)
    (tmp_path / "peers" / "10.0.0.1" / "frozen").write_text("")
    serve("10.0.0.2", GOOD)
    dest = tmp_path / "openmpi.tar.gz"
    started = time.monotonic()
    proc = pull(dest, GOOD_SHA, "10.0.0.1", "10.0.0.2", seconds=2)
    assert proc.returncode == 0 and proc.stdout.startswith("pulled from 10.0.0.2"), proc
    assert time.monotonic() - started < 15 and dest.read_bytes() == GOOD
    assert proc.stderr.splitlines() == ["10.0.0.1: not done after 2 s (artifact_cache_fanout_pull_timeout)"]
    assert calls() == ["10.0.0.1", "10.0.0.2"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("openmpi")) == ["openmpi.tar.gz"]


@pytest.mark.parametrize("args, message", [
    (["/x", "not-a-sum", "root", "60", "n1"], "is not a sha256"),
    (["/x", GOOD_SHA, "root", "60"], "no SOURCE"),
    (["/x", GOOD_SHA, "root", "soon", "n1"], "is not a whole number of seconds"),
    (["/x", GOOD_SHA, "no-such-user-here", "60", "n1"], "no user 'no-such-user-here'"),
    (["/x"], "usage:"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, message):
    proc = subprocess.run(["bash", str(PULL), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1
