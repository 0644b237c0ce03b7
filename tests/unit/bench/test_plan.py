"""`pycli bench`'s planning and statistics: which combinations run, what each run measured, and
how runs become speed-up and efficiency with their spread. Inventories through Ansible's
own loader, workloads run for real on this machine's CPU; no nodes."""

import json
import math
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycli.bench.plan import (
    ACROSS,
    WITHIN,
    BenchRequest,
    Cell,
    NodeCapacity,
    Placement,
    allreduce_job,
    allreduce_placement,
    bench_request,
    parse_choices,
    parse_process_counts,
    parse_size_range,
    placement_cluster,
    placements,
    plan_allreduce,
    plan_matrix,
    request_command,
    skip_reason,
    training_job,
)
from pycli.bench.stats import CellRun, Estimate, Measurement, estimate, measurement_from_records, ratio, summarize
from pycli.cluster.iperf import (
    measure_tcp,
    parse_iperf3,
    tcp_client_command,
    tcp_commands,
    tcp_server_command,
    tcp_stop_command,
)
from pycli.cluster.model import Cluster, Host, load_cluster
from pycli.cluster.node_facts import NodeFacts
from pycli.core.errors import BadInput
from pycli.jobs.datasets import digits_dataset
from pycli.jobs.train import JobRequest
from tests.conftest import ROOT, run_pycli, wait_process_gone

WORKLOADS = ROOT / "workloads"
CPU_NODES = [NodeCapacity(f"node{i}", cpus=2, gpus=0, torch="2.13.0", horovod="0.28.1",
                          horovod_controllers=frozenset({"gloo", "mpi"}), horovod_operations=frozenset({"gloo", "mpi"}))
             for i in (1, 2)]
GPU_NODES = [NodeCapacity(f"gpu{i}", cpus=64, gpus=4, torch="2.13.0", horovod="0.28.1",
                          horovod_controllers=frozenset({"gloo", "mpi"}),
                          horovod_operations=frozenset({"gloo", "mpi", "nccl"})) for i in (1, 2)]


# --- the request ---------------------------------------------------------------------------


def test_lists_parse_in_order_without_repeats():
    assert parse_choices("gloo, MPI,gloo", ("mpi", "gloo", "nccl"), "--backends") == ("gloo", "mpi")
    assert parse_process_counts("4,1,2,2") == (1, 2, 4)
    assert parse_size_range("4K:64K") == (4096, 8192, 16384, 32768, 65536)
    assert parse_size_range("4K:256M")[-1] == 256 * 2**20 and len(parse_size_range("4K:256M")) == 17
    assert parse_size_range("1M,4K") == (2**20, 4096)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"backends": "mpi,ucx"}, "unknown --backends 'ucx'"),
    ({"backends": " , "}, "names nothing"),
    ({"process_counts": ""}, "names no process count"),
    ({"process_counts": "1,0"}, "0 is not a positive whole number"),
    ({"process_counts": "1,-2"}, "-2 is not a positive whole number"),
    ({"process_counts": "two"}, "two is not a positive whole number"),
    ({"launchers": "deepspeed"}, "unknown --launchers 'deepspeed'"),
    ({"workload": "resnet"}, "unknown --workload 'resnet'"),
    ({"repeat": 0}, "--repeat 0"),
    ({"allreduce_sizes": "256M:4K"}, "must not exceed"),
    ({"allreduce_sizes": "3"}, "--allreduce-sizes '3'"),
    ({"allreduce_iters": 1}, "at least 2 timed"),
])
def test_bad_requests_are_bad_input(kwargs, message):
    args = {"backends": "mpi,gloo", "process_counts": "1,2", "launchers": "horovod", "workload": "synthetic", "repeat": 1,
            **kwargs}
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        bench_request(**args)


def test_the_request_writes_the_command_that_makes_it_again():
    request = bench_request(backends="mpi,gloo", process_counts="2,1", launchers="horovod", workload="synthetic",
                            repeat=2, workload_args=["--width", "8"], env=["HOROVOD_CYCLE_TIME=20"])
    assert request_command(Path("inv.ini"), request) == (
        "pycli bench -i inv.ini --backends mpi,gloo --np-list 1,2 --launchers horovod --workload synthetic --repeat 2 "
        "--allreduce-sizes 4K:256M --allreduce-iters 5 --iperf-seconds 5 --env HOROVOD_CYCLE_TIME=20 -- --width 8")


def test_every_run_of_a_bench_gets_its_env_settings():
    from pycli.bench.plan import Cell, allreduce_job, training_job

    cell = Cell("horovod", "gloo", Placement(1, 2))
    assert training_job(cell, "synthetic", (), ("A=1",)).launch.env == ("A=1",)
    assert allreduce_job(cell, "1M", 2, ("A=1",)).launch.env == ("A=1",)


# --- the matrix ----------------------------------------------------------------------------


def test_placements_split_each_count_over_servers_and_always_include_one_process():
    assert placements([2, 4]) == [Placement(1, 1), Placement(1, 2), Placement(2, 1),
                                  Placement(1, 4), Placement(2, 2), Placement(4, 1)]
    assert Placement(1, 2).scope == WITHIN and Placement(2, 1).scope == ACROSS and Placement(2, 2).processes == 4


def test_two_cpu_nodes_run_mpi_and_gloo_and_skip_nccl_with_the_reason():
    request = BenchRequest(backends=("mpi", "gloo", "nccl"), process_counts=(1, 2))
    cells, skipped = plan_matrix(request, CPU_NODES)
    assert [c.key for c in cells] == ["horovod-mpi-1x1", "horovod-mpi-1x2", "horovod-mpi-2x1",
                                      "horovod-gloo-1x1", "horovod-gloo-1x2", "horovod-gloo-2x1"]
    assert {s.cell.backend for s in skipped} == {"nccl"} and len(skipped) == 3
    assert skipped[0].reason == "NCCL needs a GPU per process (1 per server): node1 has no GPUs"


@pytest.mark.parametrize(("cell", "nodes", "workload", "reason"), [
    (Cell("torchrun", "mpi", Placement(1, 1)), CPU_NODES, "synthetic", "built without MPI"),
    (Cell("mpirun", "gloo", Placement(1, 1)), CPU_NODES, "synthetic", "MPI controller"),
    (Cell("horovod", "gloo", Placement(4, 1)), CPU_NODES, "synthetic", "needs 4 servers; the inventory has 2"),
    (Cell("horovod", "gloo", Placement(1, 4)), CPU_NODES, "synthetic",
     "4 CPU processes per server would oversubscribe it: node1 has 2 CPU cores"),
    (Cell("horovod", "nccl", Placement(2, 8)), GPU_NODES, "synthetic", "gpu1 has 4 GPUs, gpu2 has 4 GPUs"),
    (Cell("torchrun", "gloo", Placement(1, 2)), GPU_NODES, "synthetic", "synthetic.py under torchrun picks NCCL"),
    (Cell("horovod", "gloo", Placement(1, 1)), [NodeCapacity("bare", 2, 0)], "synthetic",
     "Horovod is not installed on bare; run 'pycli provision'"),
    (Cell("torchrun", "gloo", Placement(1, 1)), [NodeCapacity("bare", 2, 0)], "mnist", "torch is not installed on bare"),
    (Cell("horovod", "mpi", Placement(1, 1)), [NodeCapacity("n", 2, 0, "2.13", "0.28", frozenset({"gloo"}))], "mnist",
     "Horovod on n was built without the MPI controller"),
    (Cell("horovod", "nccl", Placement(1, 1)),
     [NodeCapacity("g", 8, 1, "2.13", "0.28", frozenset({"gloo", "mpi"}), frozenset({"gloo"}))], "mnist",
     "Horovod on g was built without NCCL"),
])
def test_what_a_cluster_cannot_run_is_skipped_with_the_reason(cell, nodes, workload, reason):
    assert reason in skip_reason(cell, nodes, workload)


@pytest.mark.parametrize(("cell", "workload"), [
    (Cell("torchrun", "gloo", Placement(1, 2)), "mnist"),  # ddp.py takes --backend gloo
    (Cell("torchrun", "nccl", Placement(2, 4)), "synthetic"),
    (Cell("mpirun", "nccl", Placement(2, 4)), "synthetic"),
    (Cell("horovod", "nccl", Placement(1, 4)), "mnist"),
])
def test_gpu_clusters_run_what_they_can(cell, workload):
    assert skip_reason(cell, GPU_NODES, workload) is None


def test_each_cell_becomes_the_train_job_that_measures_it():
    assert training_job(Cell("horovod", "mpi", Placement(2, 1)), "synthetic", ["--width", "8"]) == JobRequest.of(
        np=2, workload="synthetic", launcher="horovod", controller="mpi", script_args=("--cpu", "--width", "8"))
    assert training_job(Cell("horovod", "nccl", Placement(2, 4)), "mnist", []) == JobRequest.of(
        np=8, workload="mnist", launcher="horovod", controller="gloo", script_args=())
    assert training_job(Cell("torchrun", "gloo", Placement(1, 2)), "mnist", ["--epochs", "1"]) == JobRequest.of(
        np=2, workload="ddp", launcher="torchrun", controller="gloo",
        script_args=("--cpu", "--backend", "gloo", "--epochs", "1"))
    assert training_job(Cell("mpirun", "mpi", Placement(1, 2)), "synthetic", []).launch.controller == "mpi"


def test_the_allreduce_runs_one_process_per_server_with_the_backends_flags():
    assert allreduce_placement(CPU_NODES) == Placement(2, 1) and allreduce_placement(CPU_NODES[:1]) == Placement(1, 2)
    job = allreduce_job(Cell("torchrun", "gloo", Placement(2, 1)), "4K:1M", 3)
    assert job.launch.workload.endswith("workloads/allreduce.py") and job.launch.launcher == "torchrun"
    assert job.placement.np == 2
    assert job.launch.script_args == ("--comm", "torch", "--backend", "gloo", "--cpu", "--sizes", "4K:1M", "--iters", "3",
                               "--metrics", "metrics.jsonl")
    horovod = allreduce_job(Cell("horovod", "mpi", Placement(2, 1)), "4K", 2)
    assert horovod.launch.controller == "mpi" and horovod.launch.script_args[:3] == ("--comm", "horovod", "--cpu")
    cells, skipped = plan_allreduce(BenchRequest(backends=("mpi", "gloo", "nccl"), process_counts=(1,)), CPU_NODES)
    assert [c.key for c in cells] == ["horovod-mpi-2x1", "horovod-gloo-2x1"] and skipped[0].cell.backend == "nccl"
    assert plan_allreduce(BenchRequest(backends=("gloo",), process_counts=(1,), allreduce_sizes=None), CPU_NODES) == ([], [])


# --- one placement = one cluster in memory ------------------------------------------------


def _inventory(folder: Path) -> Path:
    inventory = folder / "cluster.ini"
    inventory.write_text(textwrap.dedent("""
        [nodes]
        node1 ansible_host=10.1.0.1 slots=1
        node2 ansible_host=10.1.0.2
        node3 ansible_host=10.1.0.3

        [nodes:vars]
        ansible_user=root
        slots=1
    """))
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "nodes.yml").write_text("pycli_network_interface: ens5\ncommon_work_dir: /data/pycli\n")
    return inventory


def test_a_placement_changes_only_the_slots_and_writes_nothing(tmp_path):
    inventory = _inventory(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    original = load_cluster(inventory)
    cluster = placement_cluster(original, Placement(3, 2))
    assert [h.slots for h in cluster.hosts] == [2, 2, 2] and [h.slots for h in original.hosts] == [1, 1, 1]
    assert [(h.name, h.address, h.user) for h in cluster.hosts] == [(h.name, h.address, h.user) for h in original.hosts]
    assert cluster.settings == original.settings == {"pycli_network_interface": "ens5", "common_work_dir": "/data/pycli"}
    assert cluster.inventory == original.inventory == inventory  # playbooks still read the user's inventory
    again = placement_cluster(cluster, Placement(3, 1))
    assert [h.slots for h in again.hosts] == [1, 1, 1]
    assert sorted(tmp_path.rglob("*")) == before


def test_one_server_runs_without_a_network_interface(tmp_path):
    inventory = _inventory(tmp_path)
    one = placement_cluster(load_cluster(inventory), Placement(1, 2))
    assert [h.slots for h in one.hosts] == [2, 2, 2] and one.settings == {"common_work_dir": "/data/pycli"}


def test_a_placement_of_a_folder_inventory_keeps_its_settings(tmp_path):
    source = tmp_path / "inventory"
    source.mkdir()
    _inventory(source)
    cluster = placement_cluster(load_cluster(source), Placement(2, 3))
    assert [h.slots for h in cluster.hosts] == [3, 3, 3] and cluster.settings["pycli_network_interface"] == "ens5"


# --- what a run measured -------------------------------------------------------------------


@pytest.mark.slow_torch
def test_a_real_synthetic_run_gives_a_measurement_with_its_own_spread(tmp_path):
    cmd = [sys.executable, str(WORKLOADS / "synthetic.py"), "--comm", "ddp", "--width", "4", "--image-size", "16",
           "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2",
           "--threads", "1", "--metrics", "s.jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    measured = measurement_from_records("synthetic", records)
    assert measured.throughput == records[-1]["total_img_per_s"] > 0 and measured.step_time_s > 0
    assert measured.throughput_ci95 is not None and measured.final_loss is None and measured.peak_memory_mb > 0
    last = records[-1]
    assert measured.step_time_ci95 == pytest.approx(
        last["step_time_s"] * last["img_per_s_per_rank_ci95"] / last["img_per_s_per_rank"])
    assert measurement_from_records("mnist", records) is None and measurement_from_records("synthetic", []) is None


@pytest.mark.slow_torch
def test_a_real_digits_run_gives_loss_and_accuracy(tmp_path):
    data = digits_dataset(tmp_path / "cache")
    cmd = [sys.executable, str(WORKLOADS / "ddp.py"), "--data-dir", str(data), "--epochs", "1", "--threads", "1",
           "--metrics", "m.jsonl", "--checkpoint", "c.pt"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    measured = measurement_from_records("mnist", records)
    assert measured.throughput == records[-1]["samples_per_s"] > 0
    assert measured.final_loss == records[-1]["train_loss"] and 0 <= measured.val_accuracy <= 1
    assert measured.step_time_ci95 == pytest.approx(1.96 * records[-1]["step_time_std_s"])


# --- statistics ----------------------------------------------------------------------------


def test_the_spread_is_over_repeats_else_the_runs_own_else_unknown():
    repeated = estimate([10.0, 12.0, 14.0])
    assert repeated == Estimate(12.0, 1.96 * 2.0, 3, "repeats")
    assert estimate([10.0], 0.5) == Estimate(10.0, 0.5, 1, "iterations")
    assert estimate([10.0]) == Estimate(10.0, None, 1, "none")


def test_ratios_add_relative_errors_in_quadrature():
    top, bottom = Estimate(30.0, 3.0, 3, "repeats"), Estimate(10.0, 0.4, 3, "repeats")
    speedup = ratio(top, bottom)
    assert speedup.mean == 3.0 and speedup.ci95 == pytest.approx(3.0 * math.hypot(0.1, 0.04))
    assert speedup.spread_from == "repeats"
    efficiency = ratio(top, bottom, 4)
    assert efficiency.mean == 0.75 and efficiency.ci95 == pytest.approx(speedup.ci95 / 4)
    assert ratio(top, Estimate(10.0, None, 1, "none")).ci95 is None


def _run(cell, repeat, throughput, step=0.1, code=0):
    measured = None if throughput is None else Measurement(step, throughput, None, None, 100.0 + repeat, 2.0, 0.5)
    return CellRun(cell, repeat, code, Path(f"/runs/{cell.key}-r{repeat}"), 10.0, measured,
                     "" if measured else "exit 1: boom")


def test_speedup_and_efficiency_are_against_the_same_backends_one_process_run():
    one, two, across = (Cell("horovod", "gloo", Placement(1, 1)), Cell("horovod", "gloo", Placement(1, 2)),
                        Cell("horovod", "gloo", Placement(2, 1)))
    other = Cell("horovod", "mpi", Placement(1, 2))
    runs = [_run(one, 1, 100.0), _run(one, 2, 110.0), _run(two, 1, 180.0), _run(two, 2, 200.0),
            _run(across, 1, 150.0), _run(across, 2, None, code=1), _run(other, 1, 50.0)]
    summaries = {s.cell: s for s in summarize([one, two, across, other], runs)}
    base = summaries[one]
    assert base.speedup == Estimate(1.0, 0.0, 2, "repeats") and base.efficiency.mean == 1.0
    assert summaries[two].speedup.mean == pytest.approx(190 / 105)
    assert summaries[two].efficiency.mean == pytest.approx(190 / 105 / 2) and summaries[two].speedup.ci95 > 0
    assert summaries[across].status == "partly failed" and summaries[across].runs_ok == 1
    assert summaries[across].speedup.mean == pytest.approx(150 / 105) and summaries[across].peak_memory_mb == 101.0
    assert summaries[other].speedup is None and summaries[other].throughput.mean == 50.0  # no mpi 1x1 baseline
    assert summaries[two].final_loss == 2.0 and summaries[two].val_accuracy == 0.5


def test_a_cell_whose_runs_all_failed_has_no_figures():
    cell = Cell("horovod", "gloo", Placement(1, 1))
    (summary,) = summarize([cell], [_run(cell, 1, None, code=1)])
    assert summary.status == "failed" and summary.throughput is None and summary.speedup is None


# --- raw TCP -------------------------------------------------------------------------------


def test_iperf3_json_gives_received_bits_and_errors_are_errors():
    output = json.dumps({"start": {}, "end": {"sum_sent": {"bits_per_second": 9.5e9},
                                              "sum_received": {"bits_per_second": 9.41e9}}})
    assert parse_iperf3("noise\n" + output) == 9.41e9
    with pytest.raises(ValueError, match="unable to connect"):
        parse_iperf3(json.dumps({"error": "unable to connect to server: Connection refused"}))
    with pytest.raises(ValueError, match="command not found"):
        parse_iperf3("bash: iperf3: command not found")


def test_iperf3_commands_are_plain_shell_for_ansible():
    start, client = tcp_commands("10.0.0.2", 5)
    assert "timeout 150 iperf3 -s -p 5201 -I" in start and "mktemp -d" in start and "/tmp/" not in start
    assert "iperf3 -c 10.0.0.2 -p 5201 -t 5 -J" in client
    stop = tcp_stop_command("/tmp/pycli-iperf3.AbC12345")
    assert "kill" in stop and "rm -rf /tmp/pycli-iperf3.AbC12345" in stop
    for command in (start, client, stop):
        assert not any(marker in command for marker in ("{{", "{%", "{#"))


@pytest.mark.parametrize("answer", ["", "/tmp", "/tmp/pycli-bench-iperf3-1.pid", "/tmp/pycli-iperf3.AbC12345; rm -rf ~",
                                    "/tmp/x/../pycli-iperf3.AbC12345/..", "relative/pycli-iperf3.AbC12345"])
def test_iperf3_stop_takes_only_a_folder_its_start_made(answer):
    with pytest.raises(ValueError):
        tcp_stop_command(answer)


# A stand-in iperf3 server as the real one starts: it writes its pidfile, then listens only after
# a while (or fails to, with iperf3's words, when told the port is taken).
_STAND_IN_SERVER = """#!/usr/bin/env python3
import os, socket, sys, time
args = sys.argv[1:]
pidfile, port = args[args.index("-I") + 1], int(args[args.index("-p") + 1])
open(pidfile, "w").write(str(os.getpid()))
time.sleep(float(os.environ.get("LISTEN_AFTER", "0")))
if os.environ.get("PORT_TAKEN"):
    print("iperf3: error - unable to start listener for connections: Address already in use")
    sys.exit(1)
server = socket.socket()
server.bind(("127.0.0.1", port))
server.listen()
time.sleep(300)
"""


def _stand_in(tmp_path: Path, script: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "iperf3"
    fake.write_text(script)
    fake.chmod(0o755)
    temp = tmp_path / "tmp"
    temp.mkdir()
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(temp)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_iperf3_server_listens_before_its_start_line_returns_and_its_stop_removes_it(tmp_path):
    """The start and stop lines, run here in bash; the stand-in listens a second after it starts,
    as a busy node's server may: the start line returns only once the port takes connections."""
    env = _stand_in(tmp_path, _STAND_IN_SERVER) | {"LISTEN_AFTER": "1"}
    port = _free_port()
    started = subprocess.run(["bash", "-c", tcp_server_command(5, port)], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    folder = Path(started.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "tmp" and (folder.stat().st_mode & 0o777) == 0o700
    pid = int((folder / "pid").read_text())
    assert Path(f"/proc/{pid}").exists()
    subprocess.run(["bash", "-c", tcp_stop_command(str(folder))], env=env, check=True)
    assert not folder.exists() and list((tmp_path / "tmp").iterdir()) == []
    assert wait_process_gone(pid, within_s=5), "the iperf3 server was not stopped"


def test_an_iperf3_server_that_cannot_listen_fails_its_start_line_in_its_own_words(tmp_path):
    env = _stand_in(tmp_path, _STAND_IN_SERVER) | {"PORT_TAKEN": "1"}
    port = _free_port()
    started = subprocess.run(["bash", "-c", tcp_server_command(5, port)], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 1 and started.stdout == ""
    assert "Address already in use" in started.stderr and f"not listening on port {port}" in started.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_iperf3_client_whose_tries_all_fail_shows_the_first_failure(tmp_path):
    """Later tries may only meet the symptom (a refused connection) of what the first one hit."""
    counter = tmp_path / "tries"
    client = ('#!/bin/bash\nn=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 )); echo $n > "$COUNTER"\n'
              'if [ $n = 1 ]; then echo \'{"error": "unable to receive control message: Connection reset by peer"}\'; '
              'else echo \'{"error": "unable to connect to server: Connection refused"}\'; fi; exit 1\n')
    env = _stand_in(tmp_path, client) | {"COUNTER": str(counter)}
    answered = subprocess.run(["bash", "-c", tcp_client_command("10.0.0.2", 1)], capture_output=True, text=True, env=env,
                              timeout=30)
    assert counter.read_text().strip() == "5"
    with pytest.raises(ValueError, match="Connection reset by peer"):
        parse_iperf3(answered.stdout)


def test_without_iperf3_the_link_is_not_measured_and_no_number_is_made_up(tmp_path):
    hosts = (Host("node1", "10.0.0.1"), Host("node2", "10.0.0.2"))
    facts = {"node1": NodeFacts("node1", iperf3="/usr/bin/iperf3"), "node2": NodeFacts("node2")}
    link = measure_tcp(Cluster(hosts, "node1"), facts, tmp_path, 5)
    assert link.gbit_per_s is None and link.note == "raw TCP not measured: iperf3 is not installed on node2"
    alone = measure_tcp(Cluster(hosts[:1], "node1"), facts, tmp_path, 5)
    assert alone.gbit_per_s is None and "one server" in alone.note


# --- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--np-list", "0"], "--np-list '0': 0 is not a positive whole number of processes"),
    (["--np-list", ""], "--np-list '' names no process count"),
    (["--backends", "mpi,foo"], "unknown --backends 'foo'"),
    (["--repeat", "0"], "--repeat 0"),
    (["--workload", "resnet"], "unknown --workload 'resnet'"),
    (["-i", "/nonexistent/inventory.ini"], "no such inventory"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    proc = run_pycli("bench", *args, env={"PYCLI_RUNS": str(tmp_path / "runs")})
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
