"""pycli check --deep: the pair rounds, the comparison with the others' median, the probes'
output, the pictures; and --fence putting the named nodes on the drained list."""

import itertools
import json
import os
import subprocess
import sys

import pytest

from pycli.cluster.drained import with_drained
from pycli.cluster.model import load_cluster
from pycli.core.errors import BadInput
from pycli.health.deep import (
    DEEP_GATES,
    compute_command,
    evaluate_compute,
    evaluate_links,
    pair_allreduce_command,
    pair_rounds,
    parse_compute,
    parse_pair_allreduce,
    probe_bundle,
    ratios_to_others,
)
from pycli.health.figures import Link
from pycli.health.gates import FAIL, PASS
from pycli.health.options import check_options
from pycli.health.plots import plot_compute, plot_links
from pycli.health.run import drain_suspects, gates_for


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9, 16])
def test_every_pair_is_measured_once_in_rounds_of_disjoint_pairs(count):
    names = [f"node{i}" for i in range(1, count + 1)]
    rounds = pair_rounds(names)
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)  # grows linearly with N
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == sorted(itertools.combinations(names, 2))  # every pair once, in inventory order
    for round_ in rounds:
        busy = [name for pair in round_ for name in pair]
        assert len(busy) == len(set(busy)) and len(round_) == count // 2  # each node in one pair at a time


def test_each_figure_is_compared_with_the_median_of_the_others():
    assert ratios_to_others({"a": 10.0, "b": 10.0, "c": 3.0}) == {"a": pytest.approx(10 / 6.5), "b": pytest.approx(10 / 6.5),
                                                                   "c": pytest.approx(0.3)}
    assert ratios_to_others({"a": 1.0}) == {}


def test_the_compute_gate_names_exactly_the_slow_node():
    result, suspects = evaluate_compute({"node1": 40.0, "node2": 41.0, "node3": 9.0}, {}, 0.6)
    assert result.status == FAIL and suspects == {"node3": "compute 0.22 of the median"}
    assert result.message.startswith("node3: compute 0.22 of the median (below 0.6)")
    healthy, none = evaluate_compute({"node1": 40.0, "node2": 35.0, "node3": 38.0}, {}, 0.6)
    assert healthy.status == PASS and none == {} and "GFLOP/s node1 40.0, node2 35.0, node3 38.0" in healthy.figure
    broken, _ = evaluate_compute({"node1": 40.0}, {"node2": "No module named 'torch'"}, 0.6)
    assert broken.status == FAIL and "node2: No module named 'torch'" in broken.message


def _compute_rounds(monkeypatch, tmp_path, rounds: list[dict[str, float]]):
    """gate_compute on three nodes whose probes answer `rounds` in turn; the gate and its context."""
    import pycli.health.deep as check_deep
    from pycli.cluster.model import Cluster, Host
    from pycli.cluster.nodes import NodeOutput
    from pycli.health.gates import CheckContext

    answered = iter(rounds)

    def ssh_each(commands, timeout_s, stdin):
        figures = next(answered)
        return {host.name: NodeOutput(host.name, 0, json.dumps({"cpu": figures[host.name]}) + "\n") for host, _ in commands}

    monkeypatch.setattr(check_deep, "ssh_each", ssh_each)
    hosts = tuple(Host(f"node{i}", f"10.0.0.{i}", user="root") for i in (1, 2, 3))
    ctx = CheckContext(Cluster(hosts, "node1"), tmp_path, check_options())
    return check_deep.gate_compute(ctx), ctx, answered


def test_a_node_slow_in_one_round_is_measured_again_and_not_named(monkeypatch, tmp_path):
    result, ctx, left = _compute_rounds(monkeypatch, tmp_path, [
        {"node1": 146.0, "node2": 85.0, "node3": 153.0},  # CI, 2026-11-27: node2 at 0.57 for one 2 s probe
        {"node1": 131.0, "node2": 140.0, "node3": 124.0},
        {"node1": 1.0, "node2": 1.0, "node3": 1.0},  # never asked
    ])
    assert result.status == PASS and ctx.suspects == {}, result
    assert ctx.deep["compute"]["rounds"] == 2 and ctx.deep["compute"]["gflops"] == {"node1": 146.0, "node2": 140.0, "node3": 153.0}
    assert "each node's best of 2 rounds" in result.figure and next(left)["node1"] == 1.0


def test_a_node_slow_in_both_rounds_is_named(monkeypatch, tmp_path):
    result, ctx, _ = _compute_rounds(monkeypatch, tmp_path, [
        {"node1": 144.0, "node2": 145.0, "node3": 12.7}, {"node1": 120.0, "node2": 150.0, "node3": 13.0},
    ])
    assert result.status == FAIL and list(ctx.suspects) == ["node3"] and ctx.deep["compute"]["rounds"] == 2
    assert result.message.startswith("node3: compute 0.09 of the median (below 0.6)"), result.message
    assert "each node's best of 2 rounds" in result.figure
    healthy, ctx, left = _compute_rounds(monkeypatch, tmp_path, [{"node1": 40.0, "node2": 35.0, "node3": 38.0}, {}])
    assert healthy.status == PASS and ctx.deep["compute"]["rounds"] == 1 and "rounds" not in healthy.figure


def test_the_link_gate_names_the_pairs_through_the_slow_node_and_the_node_itself():
    names = ["node1", "node2", "node3", "node4"]
    slow = "node3"
    links = [Link(a, b, 1.2 if slow in (a, b) else 12.0 + i) for i, (a, b) in enumerate(itertools.combinations(names, 2))]
    result, suspects = evaluate_links(names, links, 0.5)
    assert result.status == FAIL and list(suspects) == ["node3"]
    named = {line.split(":")[0] for line in result.message.split("; ") if "<->" in line}
    assert named == {"node1 <-> node3", "node2 <-> node3", "node3 <-> node4"}
    assert "every slow pair goes through node3" in result.message
    three, suspects = evaluate_links(names[:3], [Link("node1", "node2", 13.0), Link("node1", "node3", 1.4),
                                                 Link("node2", "node3", 1.3)], 0.5)
    assert three.status == FAIL and list(suspects) == ["node3"]  # 2 of 3 pairs slow: still the node they share
    two, _ = evaluate_links(names[:2], [Link("node1", "node2", 0.1)], 0.5)
    assert two.status == PASS and "fewer than 3 nodes" in two.figure
    broken, _ = evaluate_links(names[:2], [Link("node1", "node2", None, "iperf3 -c on node1: unable to connect")], 0.5)
    assert broken.status == FAIL and "node1 <-> node2: iperf3 -c on node1: unable to connect" in broken.message


def test_a_pair_slow_only_in_its_allreduce_is_named_and_a_failed_allreduce_fails_the_gate():
    names = ["node1", "node2", "node3"]
    links = [Link("node1", "node2", 13.0, allreduce_gbps=0.9), Link("node1", "node3", 12.5, allreduce_gbps=0.1),
             Link("node2", "node3", 13.2, allreduce_gbps=0.8)]
    result, suspects = evaluate_links(names, links, 0.5)
    assert result.status == FAIL and suspects == {}  # one slow pair: no node all of whose pairs are slow
    assert result.message.startswith("node1 <-> node3: allreduce 12% of the median pair;")
    assert "allreduce 0.1 to 0.9 GB/s busbw" in result.figure
    healthy, _ = evaluate_links(names, [Link(l.a, l.b, l.gbit_per_s, allreduce_gbps=0.85) for l in links], 0.5)
    assert healthy.status == PASS
    broken, _ = evaluate_links(names[:2], [Link("node1", "node2", 13.0, allreduce_note="allreduce rank on node2: exit 1")], 0.5)
    assert broken.status == FAIL and broken.message == "node1 <-> node2: allreduce rank on node2: exit 1"


@pytest.mark.slow_torch
def test_the_pair_allreduce_runs_here_between_two_processes_and_reads_back(tmp_path):
    """Both ranks of the probe as the nodes run them (bash, this venv's torch, Gloo over loopback)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    bundle = tmp_path / "bundle.tgz"  # the workloads folder, as ssh_each hands it to every node
    bundle.write_bytes(probe_bundle())
    with bundle.open("rb") as first, bundle.open("rb") as second:
        ranks = [subprocess.Popen(["bash", "-c", pair_allreduce_command(sys.executable, rank, "127.0.0.1", port, "lo")],
                                  stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for rank, stdin in enumerate((first, second))]
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert all(parse_pair_allreduce(out.decode()) > 0.001 for out, _ in outputs)
    for bad in ("", "RuntimeError: Connection refused", '{"busbw_gbps": 0}'):
        with pytest.raises(ValueError):
            parse_pair_allreduce(bad)


@pytest.mark.slow_torch
def test_the_compute_probe_runs_here_and_its_output_reads_back():
    done = subprocess.run(["bash", "-c", compute_command(sys.executable, 0.2)], input=probe_bundle(), capture_output=True,
                          timeout=120)
    figures = parse_compute(done.stdout.decode())
    assert done.returncode == 0 and list(figures) == ["cpu"] and figures["cpu"] > 0.1
    for bad in ("", "Traceback ...\nModuleNotFoundError: No module named 'torch'", '{"cpu": "fast"}'):
        with pytest.raises(ValueError):
            parse_compute(bad)


def test_the_pictures_are_written(tmp_path):
    links = [Link("a", "b", 10.0, allreduce_gbps=0.8), Link("a", "c", 1.0, allreduce_gbps=0.1), Link("b", "c", 9.5, allreduce_gbps=0.7)]
    plot_links(["a", "b", "c"], links, tmp_path / "links.png")
    plot_links(["a", "b", "c"], links, tmp_path / "allreduce.png", allreduce=True)
    plot_compute({"a": 40.0, "b": 12.0}, {"b"}, tmp_path / "compute.png")
    for name in ("links.png", "allreduce.png", "compute.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_deep_gates_run_after_the_usual_ones_and_fence_needs_deep():
    options = dict(busbw_floor_gbps=0, controller="gloo", allreduce_size="64M", controllers="gloo", cuda_image="img")
    assert gates_for(check_options(**options))[-1].name == "docker_gpu"
    assert gates_for(check_options(**options, deep=True))[-3:] == DEEP_GATES
    assert [g.name for g in gates_for(check_options(**options, deep_only=True))] == ["reachable", "gpu_health", "compute", "links"]
    with pytest.raises(BadInput, match="--fence drains the nodes the deep gates name; it needs --deep"):
        check_options(**options, fence=True)
    with pytest.raises(BadInput, match="--link-fraction 1.5: give the share"):
        check_options(**options, deep=True, link_fraction=1.5)


def test_fence_drains_the_suspects_with_their_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCLI_STATE", str(tmp_path / "state"))
    inventory = tmp_path / "c.ini"
    inventory.write_text("[nodes]\nnode1 ansible_host=10.9.0.1\nnode2 ansible_host=10.9.0.2\nnode3 ansible_host=10.9.0.3\n")
    cluster = with_drained(load_cluster(inventory))
    fenced = drain_suspects(cluster, {"node3": "compute 0.22 of the median"}, print)
    assert len(fenced) == 1 and fenced[0].startswith("node3 (pycli check --deep: compute 0.22 of the median; since ")
    assert [e.node for e in with_drained(load_cluster(inventory)).drained] == ["node3"]


def test_a_pair_s_figure_is_its_slower_direction():
    from pycli.cluster.iperf import parse_iperf3, tcp_client_command

    both = {"end": {"sum_received": {"bits_per_second": 9e9}, "sum_received_bidir_reverse": {"bits_per_second": 1e9}}}
    assert parse_iperf3(json.dumps(both)) == 1e9
    assert "--bidir" in tcp_client_command("10.9.0.2", 2, both_ways=True) and "--bidir" not in tcp_client_command("10.9.0.2", 2)


def test_a_failing_deep_gate_leaves_the_next_deep_gate_to_run(tmp_path):
    from pycli.health.gates import NOT_RUN, Gate, GateResult
    from pycli.health.run import run_gates

    ran = []

    def gate(name, status, stops=True):
        return Gate(name, name, lambda ctx: ran.append(name) or GateResult(name, status), stops_the_check=stops)

    results = run_gates([gate("compute", FAIL, stops=False), gate("links", FAIL), gate("after", PASS)], ctx=None)
    assert ran == ["compute", "links"] and [r.status for r in results] == [FAIL, FAIL, NOT_RUN]


@pytest.mark.slow_torch
def test_the_probes_travel_with_the_workloads_they_import_and_leave_nothing_behind(tmp_path):
    """The bundle holds the probes and allreduce.py (pair_allreduce.py's busbw); the probe's
    folder is gone when it ends, whether it succeeded or not."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(probe_bundle())) as tar:
        names = set(tar.getnames())
    assert {"compute_probe.py", "pair_allreduce.py", "allreduce.py"} <= names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    failing = compute_command(sys.executable, "not-a-number")
    done = subprocess.run(["bash", "-c", failing], input=probe_bundle(), capture_output=True, env=env, timeout=120)
    assert done.returncode != 0 and b"ValueError" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_plots_import_the_figures_and_never_the_check():
    loaded = subprocess.run([sys.executable, "-c", "import sys, pycli.health.plots; print('pycli.health.deep' in sys.modules)"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


def test_with_deep_a_failed_whole_cluster_gate_leaves_the_per_node_and_per_pair_gates_to_run():
    """A slow link failed the 12-rank allreduce first; the links gate, the one that names the
    pair, must still run. Only an unreachable node stops them."""
    from pycli.health.gates import NOT_RUN, Gate, GateResult
    from pycli.health.run import run_gates

    def gate(name, status, **kw):
        return Gate(name, name, lambda ctx: ran.append(name) or GateResult(name, status), **kw)

    def deep(name, status):
        return gate(name, status, after_failure=True, stops_the_check=name == "links")

    ran: list[str] = []
    results = run_gates([gate("reachable", PASS), gate("allreduce", FAIL), gate("nvidia_smi", PASS),
                         deep("compute", PASS), deep("links", FAIL)], ctx=None)
    assert ran == ["reachable", "allreduce", "compute", "links"]
    assert [r.status for r in results] == [PASS, FAIL, NOT_RUN, PASS, FAIL]
    ran = []
    results = run_gates([gate("reachable", FAIL), gate("allreduce", PASS), deep("compute", PASS)], ctx=None)
    assert ran == ["reachable"] and [r.status for r in results] == [FAIL, NOT_RUN, NOT_RUN]
