"""`pycli check --deep` on the session's 3-node local cluster (`three_nodes`): a node whose CPU share is cut is named by the compute gate, a node whose link is
slowed by the pairs through it, even after the whole-cluster allreduce gate failed; `--fence` drains them and jobs leave them out until undrained.

Figures are compared with each other, never with a speed: the faults are far outside the
spread of healthy nodes (a CPU share of 0.3, a link shaped to 100 Mbit/s). The gpu_health gate
is skipped here (no GPU); tests/unit/health/test_gpu_health.py reads recorded real GPU output.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_pycli
from tests.integration.conftest import CLUSTER3, node_shell

# Both tests compare the nodes' compute: the other lane of make test waits meanwhile (conftest.py).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_machine")]


def _cpus(node: str, share: str) -> None:
    """docker update --cpus: the node's share of this machine's cores (all of them: no limit;
    this Docker keeps the old limit on --cpus 0)."""
    subprocess.run(["docker", "update", "--cpus", share, f"pycli-{CLUSTER3}-{node}"], check=True, capture_output=True)


def _on(node: str, command: str) -> None:
    code, output = node_shell(node, command, cluster=CLUSTER3)
    assert code == 0, f"{node}: {command}: {output}"


def _deep_check(inventory: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    """`pycli check --deep-only --json` (`--deep` among `extra`: the whole check)."""
    scope = [] if "--deep" in extra else ["--deep-only"]
    proc = run_pycli("check", str(inventory), *scope, "--json", *extra, env={"PYCLI_RUNS": str(tmp_path)})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _gate(summary: dict, name: str) -> dict:
    return next(gate for gate in summary["gates"] if gate["name"] == name)


def test_a_node_with_a_cut_cpu_share_is_named_fenced_and_left_out_until_undrained(three_nodes, tmp_path):
    _cpus("node3", "0.3")
    try:
        code, summary = _deep_check(three_nodes, tmp_path, "--fence")
    finally:
        _cpus("node3", str(os.cpu_count()))
    compute = _gate(summary, "compute")
    assert code == 1 and compute["status"] == "fail", json.dumps(summary, indent=2)
    assert re.fullmatch(r"node3: compute 0\.\d\d of the median \(below 0\.6\).*", compute["message"]), compute["message"]
    assert [gate["name"] for gate in summary["gates"]] == ["reachable", "gpu_health", "compute", "links"]  # --deep-only
    assert _gate(summary, "gpu_health") == {**_gate(summary, "gpu_health"), "status": "skip", "figure": "no NVIDIA GPU on any node"}
    assert set(summary["deep"]["compute"]["gflops"]) == {"node1", "node2", "node3"}
    assert [line.split(" (")[0] for line in summary["fenced"]][:1] == ["node3"]
    assert (Path(summary["run_dir"]) / "compute.png").stat().st_size > 0
    # The links were measured too (a failing compute gate does not stop them): 3 pairs, 3 rounds.
    assert len(summary["deep"]["links"]) == 3 and (Path(summary["run_dir"]) / "links.png").stat().st_size > 0
    for node in summary["deep"]["suspects"]:
        if node != "node3":  # the links gate may name node3 too (its share of the CPU slows iperf3)
            pytest.fail(f"{node} named: {summary['deep']['suspects']}")

    job = run_pycli("train", "mnist", "--np", "2", "-i", str(three_nodes), "--", "--epochs", "1", "--threads", "1")
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
    assert "pycli: leaving out drained node3 (pycli check --deep: compute 0." in job.stderr
    assert re.search(r"pycli: job \S+: 2 process\(es\) on node1, node2 via", job.stdout)
    assert run_pycli("undrain", "node3", "-i", str(three_nodes)).returncode == 0
    hostfile = run_pycli("hostfile", str(three_nodes))  # all three again
    assert hostfile.stdout.count("slots=1") == 3 and hostfile.stderr == "", hostfile.stderr


def test_a_node_with_a_slowed_link_is_named_through_exactly_its_pairs(three_nodes, tmp_path):
    """node2's link at 100 Mbit/s, and the whole check (`--deep`, not `--deep-only`): the
    whole-cluster allreduce gate fails first (here by a bus bandwidth floor no link reaches; on
    a real cluster, by Horovod's rendezvous timeout), and the per-node and per-pair gates still
    run: they are what names node2."""
    _on("node2", "tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 50ms")
    try:
        code, summary = _deep_check(three_nodes, tmp_path, "--deep", "--allreduce-size", "1M", "--busbw-floor", "1000")
    finally:
        _on("node2", "tc qdisc del dev eth0 root")
    status = {gate["name"]: gate["status"] for gate in summary["gates"]}
    assert status["allreduce"] == "fail" and status["nvidia_smi"] == "not run", status
    links = _gate(summary, "links")
    assert code == 1 and links["status"] == "fail" and _gate(summary, "compute")["status"] == "pass", json.dumps(summary, indent=2)
    named = set(re.findall(r"(node\d <-> node\d): \d+% of the median link", links["message"]))
    assert named == {"node1 <-> node2", "node2 <-> node3"}, links["message"]
    # The pairs' allreduce goes through the same slowed link, and says so.
    reduced = set(re.findall(r"(node\d <-> node\d): [^;]*allreduce \d+% of the median pair", links["message"]))
    assert reduced == named and all(link["allreduce_gbps"] > 0 for link in summary["deep"]["links"]), links["message"]
    assert (Path(summary["run_dir"]) / "allreduce.png").stat().st_size > 0
    assert summary["deep"]["suspects"] == {"node2": summary["deep"]["suspects"]["node2"]}
    assert "fenced" not in summary  # no --fence: nothing drained
    assert run_pycli("inventory", "show", str(three_nodes)).stdout.count("drained:") == 0
