"""`pycli check` and `pycli bench` on the real 2-node local cluster after `pycli provision`
(the session's `provisioned_cluster`, shared with test_train).

The check must pass on a freshly provisioned cluster and fail at the right gate, with the
right message, when node2's sshd is stopped or its Horovod is taken away; the bench must
write every file with sane figures. Figures are checked for sanity, never for speed.
"""

import csv
import json
import re
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import run_pycli
from tests.integration.conftest import NODE_VENV, node_shell

pytestmark = pytest.mark.integration
TINY_SYNTHETIC = ["--width", "8", "--image-size", "32", "--batch-size", "4", "--num-warmup-batches", "1",
                  "--num-batches-per-iter", "2", "--num-iters", "2", "--threads", "1"]


def _on_node2(command: str) -> str:
    code, text = node_shell("node2", command)
    assert code == 0, f"{command}: {text}"
    return text


def _check(inventory: Path, tmp_path: Path) -> tuple[int, dict]:
    proc = run_pycli("check", str(inventory), "--json", env={"PYCLI_RUNS": str(tmp_path)})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_check_passes_every_gate_of_a_provisioned_cluster(provisioned_cluster, tmp_path):
    code, summary = _check(provisioned_cluster, tmp_path)
    assert code == 0, json.dumps(summary, indent=2)
    statuses = {gate["name"]: gate["status"] for gate in summary["gates"]}
    assert statuses == {"reachable": "pass", "ssh_mesh": "pass", "same_software": "pass", "horovod_build": "pass",
                        "mpirun": "pass", "allreduce": "pass", "nvidia_smi": "skip", "driver_library": "skip",
                        "docker_gpu": "skip"}
    figures = {gate["name"]: gate["figure"] for gate in summary["gates"]}
    assert figures["ssh_mesh"].startswith("4/4 node pairs") and "2 ranks on 2 nodes" in figures["allreduce"]
    assert re.search(r"Python \S+, torch \S+, Horovod \S+, Open MPI \S+ on 2 nodes", figures["same_software"])
    assert (Path(summary["run_dir"]) / "check.json").exists()


def test_bench_mpi_and_gloo_on_one_and_two_processes_writes_sane_files(provisioned_cluster, tmp_path):
    began = time.monotonic()
    proc = run_pycli("bench", "-i", str(provisioned_cluster), "--backends", "mpi,gloo", "--np-list", "1,2", "--repeat", "1",
                     "--allreduce-sizes", "4K:1M", "--allreduce-iters", "3", "--iperf-seconds", "2", "--", *TINY_SYNTHETIC,
                     env={"PYCLI_RUNS": str(tmp_path)}, timeout=1800)
    print(f"pycli bench --backends mpi,gloo --np 1,2 took {time.monotonic() - began:.0f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = tmp_path.glob("*-bench")
    cells = list(csv.DictReader((run_dir / "results.csv").open()))
    measured = [row for row in cells if row["status"] == "ok"]
    assert {(row["backend"], row["servers"], row["processes_per_server"]) for row in measured} >= {
        ("mpi", "1", "1"), ("mpi", "2", "1"), ("gloo", "1", "1"), ("gloo", "2", "1")}
    for row in measured:
        assert float(row["throughput"]) > 0 and float(row["step_time_ms"]) > 0 and float(row["peak_memory_mb"]) > 0
        assert 0 < float(row["efficiency"]) <= 1.2, row
    assert all(row["reason"] for row in cells if row["status"] == "skipped")
    runs = list(csv.DictReader((run_dir / "runs.csv").open()))
    assert len(runs) == len(measured) and all(row["exit_code"] == "0" for row in runs)
    sizes = list(csv.DictReader((run_dir / "allreduce.csv").open()))
    assert {row["backend"] for row in sizes} == {"mpi", "gloo"}
    assert all(row["correct"] == "True" and float(row["busbw_gbps"]) > 0 for row in sizes)
    for name in ("throughput.png", "efficiency.png", "allreduce.png"):
        with Image.open(run_dir / name) as image:
            image.verify()
        with Image.open(run_dir / name) as image:
            assert image.format == "PNG"
    results = json.loads((run_dir / "results.json").read_text())
    report = (run_dir / "report.md").read_text()
    for node in results["environment"]:
        for key in ("os", "python", "torch", "horovod", "openmpi"):
            assert node[key] and node[key] in report, key
    tcp = results["tcp"]
    if tcp["gbit_per_s"] is None:
        assert "iperf3 is not installed" in tcp["note"] and tcp["note"] in report
    else:
        assert tcp["gbit_per_s"] > 0 and "share of the wire" in report


def test_check_stops_at_same_software_when_horovod_leaves_node2(provisioned_cluster, tmp_path):
    aside = f"{NODE_VENV}/horovod.set-aside-by-test"
    _on_node2(f"mv {NODE_VENV}/lib/python3*/site-packages/horovod {aside}")
    try:
        code, summary = _check(provisioned_cluster, tmp_path)
    finally:
        _on_node2(f"mv {aside} \"$(echo {NODE_VENV}/lib/python3*/site-packages)/horovod\"")
    assert code == 1 and summary["failed_gate"] == "same_software"
    gate = next(gate for gate in summary["gates"] if gate["name"] == "same_software")
    assert re.search(r"Horovod differs: node1 \d\S*, node2 not installed", gate["message"])
    assert [g["status"] for g in summary["gates"]][3:] == ["not run"] * 6


def test_check_stops_at_reachable_with_exit_4_when_sshd_stops_on_node2(provisioned_cluster, tmp_path):
    _on_node2("systemctl stop ssh")
    try:
        code, summary = _check(provisioned_cluster, tmp_path)
    finally:
        _on_node2("systemctl start ssh && systemctl is-active ssh")
    assert code == 4 and summary["failed_gate"] == "reachable"
    gate = summary["gates"][0]
    assert gate["message"].startswith("node2: ") and "Connection refused" in gate["message"]
    assert gate["figure"] == "1/2 nodes accept an SSH login"
    assert [g["status"] for g in summary["gates"]][1:] == ["not run"] * 8
