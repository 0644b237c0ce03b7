"""The files of a bench run, made from a results document built by pycli.bench's own functions."""

import csv
import json
import sys
from datetime import datetime
from pathlib import Path

import pytest
from PIL import Image

from pycli.bench.plan import BenchRequest, Cell, Placement, Skipped
from pycli.bench.report import environment_rows, format_value, render_markdown, scaling_rows, skipped_lines, write_report
from pycli.bench.results import AllreduceRun, results_document
from pycli.bench.stats import CellRun, Measurement, summarize
from pycli.cluster.iperf import TcpLink
from pycli.cluster.node_facts import HorovodBuild, NodeFacts
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "workloads"))
import allreduce  # noqa: E402

BUILD = HorovodBuild(frozenset({"pytorch"}), frozenset({"gloo", "mpi"}), frozenset({"gloo", "mpi"}))


def node(name, **changes) -> NodeFacts:
    values = dict(host=name, hostname=name, os="Debian 12.15", kernel="6.1.0-40-amd64", cpu_model="AMD EPYC 7763",
                  cpus=2, memory_mb=8192, nic_interface="eth0", nic_driver="virtio_net", nic_speed_mbps=10000, nic_mtu=1500,
                  python="3.11.2", torch="2.13.0+cpu", horovod="0.28.1", horovod_build=BUILD, openmpi="4.1.4",
                  iperf3="/usr/bin/iperf3")
    return NodeFacts(**{**values, **changes})


def _run(cell, repeat, throughput):
    return CellRun(cell, repeat, 0, Path(f"/runs/{cell.key}-r{repeat}"), 12.0,
                     Measurement(0.02, throughput, None, None, 300.0, None, None))


def document(tmp_path, tcp=None, nodes=None, runs=None):
    cells = [Cell("horovod", backend, place) for backend in ("mpi", "gloo")
             for place in (Placement(1, 1), Placement(1, 2), Placement(2, 1))]
    if runs is None:
        rates = {"1x1": 100.0, "1x2": 170.0, "2x1": 150.0}
        runs = [_run(cell, repeat, rates[str(cell.placement)] + repeat) for cell in cells for repeat in (1, 2)]
        runs.append(CellRun(cells[-1], 3, 1, Path("/runs/horovod-gloo-2x1-r3"), 3.0, None, "exit 1: Connection reset"))
    nccl = [Skipped(Cell("horovod", "nccl", place), "NCCL needs a GPU per process (1 per server): node1 has no GPUs")
            for place in (Placement(1, 1), Placement(2, 1))]
    sizes = [{"workload": "allreduce", "comm": "horovod", "backend": "gloo", "device": "cpu", "ranks": 2, "hosts": 2,
              "correct": True, **allreduce.size_record(size, 2, [size / 2e8, size / 1.9e8])} for size in (4096, 2**20)]
    allreduce_runs = [AllreduceRun(Cell("horovod", "gloo", Placement(2, 1)), 0, Path("/runs/ar"), sizes)]
    return results_document(
        inventory=tmp_path / "inv.ini", request=BenchRequest(backends=("mpi", "gloo", "nccl"), process_counts=(1, 2), repeat=2),
        run_dir=tmp_path, started=datetime(2026, 11, 22, 8, 0), seconds=321.0, interrupted=False,
        nodes=nodes or [node("node1"), node("node2")], summaries=summarize(cells, runs), skipped=nccl,
        allreduce_runs=allreduce_runs, allreduce_skipped=[Skipped(Cell("horovod", "nccl", Placement(2, 1)), "no GPUs")],
        tcp=tcp or TcpLink("node1", "node2", None, note="raw TCP not measured: iperf3 is not installed on node2"),
    )


def test_every_file_is_written_and_the_pngs_are_images(tmp_path):
    doc = document(tmp_path)
    written = write_report(doc, tmp_path)
    assert [p.name for p in written] == ["report.md", "results.json", "results.csv", "runs.csv", "allreduce.csv",
                                         "throughput.png", "efficiency.png", "allreduce.png"]
    for png in written[-3:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(png) as image:
            image.verify()
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(doc))


def test_csv_rows_hold_every_combination_and_every_run(tmp_path):
    write_report(document(tmp_path), tmp_path)
    cells = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(cells) == 8 and {row["status"] for row in cells} == {"ok", "partly failed", "skipped"}
    base = next(row for row in cells if (row["backend"], row["servers"], row["processes_per_server"]) == ("mpi", "1", "1"))
    two = next(row for row in cells if (row["backend"], row["servers"], row["processes_per_server"]) == ("mpi", "1", "2"))
    assert float(base["speedup"]) == 1.0 and float(two["speedup"]) == pytest.approx(171.5 / 101.5)
    assert float(two["efficiency"]) == pytest.approx(171.5 / 101.5 / 2) and float(two["throughput_ci95"]) > 0
    assert two["spread_from"] == "repeats" and two["scope"] == "within one server"
    skipped = [row for row in cells if row["status"] == "skipped"]
    assert all("NCCL needs a GPU" in row["reason"] and row["throughput"] == "" for row in skipped)
    runs = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert len(runs) == 13 and runs[-1]["error"] == "exit 1: Connection reset" and runs[-1]["throughput"] == ""
    sizes = list(csv.DictReader((tmp_path / "allreduce.csv").open()))
    assert [row["bytes"] for row in sizes] == ["4096", "1048576", ""] and sizes[0]["correct"] == "True"
    assert sizes[-1]["status"] == "skipped"


def test_the_report_has_seed_003s_tables_and_names_every_version(tmp_path):
    write_report(document(tmp_path), tmp_path)
    text = (tmp_path / "report.md").read_text()
    for heading in ("## Environment", "## Speed-up within one server", "## Speed-up across servers",
                    "## Allreduce bandwidth", "## Skipped", "## Failed runs", "## Plots"):
        assert heading in text
    for version in ("Debian 12.15", "3.11.2", "2.13.0+cpu", "0.28.1", "4.1.4", "AMD EPYC 7763", "virtio_net"):
        assert version in text
    assert "| MPI | horovod | cpu | 1 | 2 | 20.0 ± 0.0 | 172 ± 1 | 1.69 ±" in text
    assert "Raw TCP: raw TCP not measured: iperf3 is not installed on node2." in text
    assert "nccl via horovod (1x1, 2x1 servers x processes): NCCL needs a GPU per process" in text
    assert "allreduce microbenchmark: nccl via horovod (2x1 servers x processes): no GPUs" in text
    assert "gloo via horovod, 2x1, run 3: exit 1: Connection reset" in text
    assert "![throughput](throughput.png)" in text


def test_a_measured_link_puts_each_backend_beside_the_wire(tmp_path):
    text = render_markdown(document(tmp_path, tcp=TcpLink("node1", "node2", 8.0, 5)), [])
    assert "Raw TCP node1 → node2: 8.00 Gbit/s = 1.000 GB/s (iperf3, one stream, 5 s)." in text
    assert "busbw at the largest size as a share of the wire: gloo (horovod) 19 %." in text


def test_the_baseline_opens_both_tables():
    cells = document(Path("/tmp"))["cells"]
    within, across = scaling_rows(cells, "within one server"), scaling_rows(cells, "across servers")
    assert [row[3:5] for row in within] == [["1", "1"], ["1", "2"]] * 2
    assert [row[3:5] for row in across] == [["1", "1"], ["2", "1"]] * 2
    assert across[-1][-1] == "2/3"


def test_a_difference_between_nodes_shows_in_the_environment():
    rows = dict(environment_rows([{**node_document(node("node1"))}, {**node_document(node("node2", horovod=""))}]))
    assert rows["Horovod"].startswith("DIFFERS: node1: 0.28.1 (") and rows["Horovod"].endswith("node2: not installed")
    assert rows["torch"] == "2.13.0+cpu" and rows["GPU"] == "none" and rows["Servers"] == "2 (node1, node2)"


def node_document(facts):
    from pycli.bench.results import facts_document

    return facts_document(facts)


def test_gpu_nodes_fill_the_gpu_rows():
    gpu = node("g1", gpus=("NVIDIA H100 80GB HBM3",) * 8, gpu_pci=("x",) * 8, nvidia_smi_rc=0, driver="580.65.06",
               nvlink_links=18, cuda="12.8.93", torch_cuda="12.8", nccl="2.26.2-1+cuda12.8", torch_nccl="2.26.2")
    rows = dict(environment_rows([node_document(gpu)]))
    assert rows["GPU"] == "8x NVIDIA H100 80GB HBM3" and rows["GPU interconnect"] == "NVLink (18 links up)"
    assert rows["CUDA"] == "12.8.93; torch built with 12.8" and rows["NCCL"] == "2.26.2-1+cuda12.8; torch built with 2.26.2"
    assert rows["GPU driver"] == "580.65.06"


def test_nothing_measured_makes_no_scaling_plots(tmp_path):
    doc = document(tmp_path, runs=[])
    written = write_report(doc, tmp_path)
    assert "throughput.png" not in [p.name for p in written] and "allreduce.png" in [p.name for p in written]
    assert "| MPI | horovod | cpu | 2 | 1 | — | — | — | — | — | — | 0/0 |" in (tmp_path / "report.md").read_text()
    assert {cell["status"] for cell in doc["cells"]} == {"not run", "skipped"}


@pytest.mark.parametrize(("value", "ci", "text"), [
    (None, None, "—"), (1234.5678, 12.3, "1235 ± 12"), (12.345, 0.5, "12.3 ± 0.5"), (0.712866, 0.0828, "0.713 ± 0.083"),
    (1.0, 0.0, "1.00 ± 0.00"), (0.0037, None, "0.0037"), (0.0, None, "0.00"),
])
def test_numbers_carry_three_significant_digits_and_their_spread(value, ci, text):
    assert format_value(value, ci) == text


def test_skips_are_grouped_by_reason():
    doc = {"cells": [{"status": "skipped", "backend": "mpi", "launcher": "torchrun", "reason": "no MPI", "servers": s,
                      "processes_per_server": p} for s, p in ((1, 1), (2, 1))], "allreduce": []}
    assert skipped_lines(doc) == ["mpi via torchrun (1x1, 2x1 servers x processes): no MPI"]
