"""`pycli check`: what the nodes' answers mean, gate by gate, and how the gates run in order."""

import subprocess
from pathlib import Path

import pytest

from pycli.cluster.model import Cluster, Drained, Host
from pycli.cluster.nodes import NodeOutput
from pycli.core.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, BadInput
from pycli.core.sizes import parse_size
from pycli.health.gates import (
    FAIL,
    NOT_RUN,
    PASS,
    SKIP,
    CheckContext,
    Gate,
    GateResult,
    docker_gpu_command,
    evaluate_allreduce,
    evaluate_docker_gpu,
    evaluate_driver_library,
    evaluate_horovod_build,
    evaluate_mesh,
    evaluate_mpirun,
    evaluate_nvidia_smi,
    evaluate_reachable,
    evaluate_same_software,
    mesh_command,
    mpirun_command,
)
from pycli.health.options import DEFAULTS, check_options
from pycli.health.run import exit_code, report_json, result_line, run_gates
from pycli.jobs.log import job_failure
from tests.conftest import run_pycli
from tests.unit.cluster.test_node_facts import GPU_PROBE, PROBE, facts

HOSTS = (Host("node1", "10.0.0.1", user="root"), Host("node2", "10.0.0.2", user="root"))
NAMES = ["node1", "node2"]


# --- the gates' verdicts -------------------------------------------------------------------


def test_an_unreachable_node_fails_the_first_gate_with_exit_4():
    answers = {"node1": NodeOutput("node1", 0), "node2": NodeOutput("node2", 255, stderr="ssh: connect to host 10.0.0.2 port 22: Connection refused\n")}
    result = evaluate_reachable(NAMES, answers)
    assert result.status == FAIL and result.exit_code == EXIT_UNREACHABLE
    assert "node2: ssh: connect to host 10.0.0.2 port 22: Connection refused" in result.message
    assert result.figure == "1/2 nodes accept an SSH login"
    assert evaluate_reachable(NAMES, {n: NodeOutput(n, 0) for n in NAMES}).status == PASS


def test_mesh_command_really_runs_and_its_failures_are_named(tmp_path):
    closed = (Host("node1", "127.0.0.1", port=1), Host("node2", "127.0.0.1", port=2))
    command = mesh_command(closed)
    assert "{{" not in command and "{%" not in command and "{#" not in command
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    answers = {host.name: NodeOutput(host.name, proc.returncode, proc.stdout) for host in closed}
    result = evaluate_mesh(closed, answers)
    assert result.status == FAIL and result.figure.startswith("0/4 node pairs")
    assert "node1 -> node2 (127.0.0.1:2): ssh: connect to host 127.0.0.1 port 2: Connection refused" in result.message


def test_a_mesh_target_is_never_read_as_an_ssh_option(tmp_path):
    # Refused when the inventory is read; should one get this far, ssh takes it as a host name.
    hostile = Host("node1", f"-oProxyCommand=touch {tmp_path}/pwned", port=1)
    subprocess.run(["bash", "-c", mesh_command((hostile,))], capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "pwned").exists()


def test_mesh_passes_when_every_pair_logs_in():
    out = "PYCLI-SSH OK 10.0.0.1:22 node1\nPYCLI-SSH OK 10.0.0.2:22 node2\n"
    result = evaluate_mesh(HOSTS, {n: NodeOutput(n, 0, out) for n in NAMES})
    assert result.status == PASS and result.figure.startswith("4/4")
    silent = evaluate_mesh(HOSTS, {"node1": NodeOutput("node1", 0, out), "node2": NodeOutput("node2", None, message="gone")})
    assert silent.status == FAIL and "node2: could not run ssh there (gone)" in silent.message


def test_horovod_missing_on_one_node_fails_same_software_naming_it():
    missing = PROBE.replace("### horovod\n0.28.1\n", "### horovod\n")
    result = evaluate_same_software(NAMES, {"node1": facts("node1"), "node2": facts("node2", missing)})
    assert result.status == FAIL
    assert "Horovod differs: node1 0.28.1, node2 not installed" in result.message
    good = evaluate_same_software(NAMES, {"node1": facts("node1"), "node2": facts("node2")})
    assert good.status == PASS and good.figure == "Python 3.11.2, torch 2.13.0+cpu, Horovod 0.28.1, Open MPI 4.1.4 on 2 nodes"


def test_nothing_installed_says_so():
    bare = {name: facts(name, "") for name in NAMES}
    result = evaluate_same_software(NAMES, bare)
    assert "Horovod is not installed on any node" in result.message and "pycli provision" in result.message


def test_horovod_build_needs_the_controllers_and_nccl_on_gpu_clusters():
    assert evaluate_horovod_build(NAMES, {n: facts(n) for n in NAMES}, ("gloo", "mpi")).status == PASS
    no_mpi = PROBE.replace("Available Controllers:\n    [X] MPI", "Available Controllers:\n    [ ] MPI")
    result = evaluate_horovod_build(NAMES, {"node1": facts("node1"), "node2": facts("node2", no_mpi)}, ("gloo", "mpi"))
    assert result.status == FAIL and result.message.startswith("node2: built without the MPI controller")
    assert evaluate_horovod_build(NAMES, {"node1": facts("node1"), "node2": facts("node2", no_mpi)}, ("gloo",)).status == PASS
    gpu = evaluate_horovod_build(NAMES, {n: facts(n, GPU_PROBE) for n in NAMES}, ("gloo", "mpi"))
    assert gpu.status == FAIL and "NCCL tensor operations" in gpu.message


def test_mpirun_command_runs_as_pycli_train_does():
    command = mpirun_command("/opt/openmpi-4.1.4/bin/mpirun", HOSTS, "root", "eth0")
    assert command.startswith("timeout 120 /opt/openmpi-4.1.4/bin/mpirun -np 2 -H 10.0.0.1:1,10.0.0.2:1")
    assert "--allow-run-as-root" in command and "btl_tcp_if_include eth0" in command and command.endswith(" hostname")
    ported = mpirun_command("mpirun", (Host("a", "10.0.0.1", port=2222), Host("b", "10.0.0.2", port=2222)), "ml", None)
    assert "--allow-run-as-root" not in ported and "plm_rsh_args '-p 2222'" in ported


def test_mpirun_must_run_once_on_every_node():
    node_facts = {n: facts(n) for n in NAMES}
    assert evaluate_mpirun(NAMES, node_facts, NodeOutput("node1", 0, "node2\nnode1\n"), 1.0).status == PASS
    twice = evaluate_mpirun(NAMES, node_facts, NodeOutput("node1", 0, "node1\nnode1\n"), 1.0)
    assert twice.status == FAIL and "expected each of node1, node2 once" in twice.message
    broken = evaluate_mpirun(NAMES, node_facts, NodeOutput("node1", 1, "", "ORTE was unable to reliably start"), 1.0)
    assert broken.status == FAIL and "ORTE was unable" in broken.message


RECORD = {"workload": "allreduce", "bytes": 64 * 2**20, "busbw_gbps": 1.5, "busbw_gbps_ci95": 0.1, "ranks": 2,
          "hosts": 2, "backend": "gloo", "correct": True}


def test_allreduce_gate_checks_the_result_and_the_floor():
    size = 64 * 2**20
    assert evaluate_allreduce([RECORD], ranks=2, nodes=2, size=size, floor_gbps=0).status == PASS
    low = evaluate_allreduce([RECORD], ranks=2, nodes=2, size=size, floor_gbps=2.0)
    assert low.status == FAIL and "below the floor of 2 GB/s" in low.message
    one_node = evaluate_allreduce([{**RECORD, "hosts": 1}], ranks=2, nodes=2, size=size, floor_gbps=0)
    assert one_node.status == FAIL
    assert "wrote no result" in evaluate_allreduce([], ranks=2, nodes=2, size=size, floor_gbps=0).message


def test_gpu_gates_skip_cpu_clusters_and_catch_a_driver_mismatch():
    cpu = {n: facts(n) for n in NAMES}
    assert evaluate_nvidia_smi(NAMES, cpu).status == SKIP and evaluate_driver_library(NAMES, cpu).status == SKIP
    gpu = {n: facts(n, GPU_PROBE) for n in NAMES}
    assert evaluate_nvidia_smi(NAMES, gpu).figure == "node1 2x NVIDIA H100 80GB HBM3, node2 2x NVIDIA H100 80GB HBM3"
    assert evaluate_driver_library(NAMES, gpu).status == PASS
    upgraded = GPU_PROBE.replace("libnvidia-ml.so.580.65.06", "libnvidia-ml.so.580.82.07").replace(
        "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\nNVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\nrc=0",
        "Failed to initialize NVML: Driver/library version mismatch\nrc=18")
    gpu["node2"] = facts("node2", upgraded)
    smi = evaluate_nvidia_smi(NAMES, gpu)
    assert smi.status == FAIL and "node2: nvidia-smi failed: Failed to initialize NVML: Driver/library version mismatch" in smi.message
    lib = evaluate_driver_library(NAMES, gpu)
    assert lib.status == FAIL and "node2: kernel module 580.65.06, user-space library (NVML) 580.82.07" in lib.message


def test_docker_gpu_gate_counts_the_gpus_the_container_sees():
    gpu = {n: facts(n, GPU_PROBE) for n in NAMES}
    listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    answers = {n: NodeOutput(n, 0, listing) for n in NAMES}
    assert evaluate_docker_gpu(NAMES, gpu, answers, DEFAULTS.cuda_image).status == PASS
    answers["node2"] = NodeOutput("node2", 125, "", "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].")
    result = evaluate_docker_gpu(NAMES, gpu, answers, DEFAULTS.cuda_image)
    assert result.status == FAIL and "could not select device driver" in result.message
    assert docker_gpu_command("img:1") == "timeout 900 docker run --rm --gpus all img:1 nvidia-smi -L"


# --- running the gates ---------------------------------------------------------------------


def _context(tmp_path) -> CheckContext:
    return CheckContext(Cluster(HOSTS, "node1"), tmp_path, check_options(
        busbw_floor_gbps=0, controller="gloo", allreduce_size="64M", controllers="gloo,mpi", cuda_image=DEFAULTS.cuda_image))


def test_gates_run_in_order_and_stop_at_the_first_failure(tmp_path):
    ran = []

    def gate(name, status):
        def run(ctx):
            ran.append(name)
            return GateResult(name, status, f"figure of {name}", "what to do" if status == FAIL else "")
        return Gate(name, name, run)

    gates = [gate("one", PASS), gate("two", SKIP), gate("three", FAIL), gate("four", PASS)]
    shown = []
    results = run_gates(gates, _context(tmp_path), on_result=shown.append)
    assert ran == ["one", "two", "three"] and [r.status for r in results] == [PASS, SKIP, FAIL, NOT_RUN]
    assert shown == results and exit_code(results) == EXIT_FAILED
    assert exit_code(results[:2]) == EXIT_OK
    assert result_line(3, results[2]).startswith("FAIL  3 three") and result_line(3, results[2]).endswith("\n        what to do")
    assert result_line(4, results[3]) == "----  4 four            not run"
    summary = report_json(Path("inv.ini"), tmp_path, results)
    assert summary["failed_gate"] == "three" and summary["passed"] is False and summary["exit_code"] == 1
    assert [g["status"] for g in summary["gates"]] == ["pass", "skip", "fail", "not run"]
    assert summary["drained"] == []
    drained = (Drained("node2", "ECC errors", "2026-11-25T04:00:00Z"),)
    assert report_json(Path("inv.ini"), tmp_path, results, drained)["drained"] == [
        {"node": "node2", "reason": "ECC errors", "since": "2026-11-25T04:00:00Z"}]


def test_the_unreachable_exit_code_is_the_failing_gates():
    results = [GateResult("reachable", FAIL, exit_code=EXIT_UNREACHABLE), GateResult("ssh_mesh", NOT_RUN)]
    assert exit_code(results) == EXIT_UNREACHABLE


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"busbw_floor_gbps": -1}, "--busbw-floor"),
    ({"controller": "nccl"}, "unknown --controller 'nccl'"),
    ({"allreduce_size": "64Q"}, "--allreduce-size '64Q'"),
    ({"controllers": "gloo,ccl"}, "--build-controllers"),
    ({"cuda_image": "a b"}, "--cuda-image"),
])
def test_bad_options_are_bad_input(kwargs, message):
    options = {"busbw_floor_gbps": 0.0, "controller": "gloo", "allreduce_size": "64M", "controllers": "gloo,mpi",
               "cuda_image": DEFAULTS.cuda_image, **kwargs}
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        check_options(**options)


def test_sizes_read_like_nccl_tests():
    assert parse_size("4K", "x") == 4096 and parse_size("64M", "x") == 64 * 2**20 and parse_size("1G", "x") == 2**30
    with pytest.raises(BadInput):
        parse_size("6", "x")


@pytest.mark.parametrize(("args", "message"), [
    (["/nonexistent/inventory.ini"], "no such inventory"),
    (["/nonexistent/inventory.ini", "--controller", "nccl"], "unknown --controller 'nccl'"),
    (["/nonexistent/inventory.ini", "--busbw-floor", "-2"], "--busbw-floor -2.0"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    proc = run_pycli("check", *args, env={"PYCLI_RUNS": str(tmp_path / "runs")})
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_failed_jobs_reason_is_its_first_exception():
    lines = ["pycli: job 1: 2 process(es)", "[1,0]<stderr>:Traceback (most recent call last):",
             "[1,0]<stderr>:TypeError: _DistributedOptimizer.zero_grad() got an unexpected keyword argument 'set_to_none'",
             "RuntimeError: Horovod detected that one or more processes exited with non-zero status",
             "pycli: job failed (exit 1) after 16 s"]
    assert job_failure(lines).endswith("TypeError: _DistributedOptimizer.zero_grad() got an unexpected keyword argument 'set_to_none'")
    assert job_failure(["a", "b", "c", "d", "pycli: job failed"]) == "b | c | d"
    assert job_failure([]) == "no output"


def test_one_local_host_needs_no_ssh_mesh_and_nothing_is_run_for_it(tmp_path):
    from pycli.cluster.model import load_cluster
    from pycli.health.gates import CheckContext, gate_ssh_mesh
    from pycli.health.options import DEFAULTS

    inventory = tmp_path / "local.ini"
    inventory.write_text("[nodes]\nlocalhost ansible_connection=local\n")
    ctx = CheckContext(load_cluster(inventory), tmp_path / "run", DEFAULTS)
    result = gate_ssh_mesh(ctx)
    assert result.status == "skip" and "ansible_connection=local" in result.figure
    assert not (tmp_path / "run").exists()  # no Ansible run


def test_horovod_s_rendezvous_timeout_is_said_with_what_it_means():
    lines = ["pycli: job 1: 12 process(es)",
             "[0]<stderr>:RuntimeError: Gloo context initialization failed: [/tmp/pip-req-build/third_party/gloo/gloo/"
             "rendezvous/context.cc:81] Wait timeout after 30 seconds for key(s): 0. You may want to increase the timeout "
             "via HOROVOD_GLOO_TIMEOUT_SECONDS",
             "pycli: job failed (exit 1) after 41 s"]
    said = job_failure(lines)
    assert said.startswith("[0]<stderr>:RuntimeError: Gloo context initialization failed") and "Wait timeout after 30" in said
    assert "not every rank reached horovodrun's rendezvous within 30 s" in said and "pycli check --deep" in said
