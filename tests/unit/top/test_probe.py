"""`pycli top`'s pieces that need no cluster: the node probe run by bash here (a stand-in
nvidia-smi printing a real H200's recorded answers), its parsers, Prometheus's answers, the
worst-first order, the drawing, and bad input."""

import json
import os
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from rich.console import Console

from pycli.cli.app import main
from pycli.cluster.model import Drained, load_cluster
from pycli.cluster.nodes import NodeOutput
from pycli.core.errors import BadInput
from pycli.jobs.launch import NodeLayout
from pycli.jobs.slurm import parse_squeue, running_jobs_by_node
from pycli.cluster.slurm_nodes import NodeState, expand_hostlist
from pycli.top.frame import TopRequest
from pycli.top.model import ClusterSide, Frame, GpuSample, NodeSample, NodeView, node_views
from pycli.top.probe import node_sample, parse_apps, parse_query_gpu, probe_command, samples_from_answers
from pycli.top.prometheus import PrometheusUnavailable, parse_answers
from pycli.top.view import render
from pycli_node.gpu_probe import Section, split_sections
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "recorded"
JOBS = NodeLayout().jobs_dir
H200_UUID = "GPU-f65644dd-8ede-e4bc-799e-fa29109df3b2"


def test_the_recorded_h200_query_reads_as_one_gpu_idle_and_busy():
    (idle,) = parse_query_gpu((RECORDED / "nvidia-smi-query-gpu-h200-idle.csv").read_text())
    (busy,) = parse_query_gpu((RECORDED / "nvidia-smi-query-gpu-h200-busy.csv").read_text())
    assert (idle.index, idle.name, idle.uuid) == (0, "NVIDIA H200", H200_UUID)
    assert (idle.util_pct, idle.mem_used_mib, idle.mem_total_mib, idle.temp_c) == (0, 0, 143771, 35)
    assert (idle.power_w, idle.power_limit_w, idle.ecc_uncorrected) == (78.34, 700.0, 0)
    assert (busy.util_pct, busy.mem_used_mib, busy.temp_c, busy.power_w) == (99, 883, 58, 696.3)
    assert not idle.problem and not busy.problem
    assert parse_apps((RECORDED / "nvidia-smi-query-apps-h200-busy.csv").read_text()) == {H200_UUID: [4343]}


def test_not_supported_fields_read_as_unknown_not_zero():
    (gpu,) = parse_query_gpu("0, GPU-1, Tesla T4, 00000000:3B:00.0, 12, 100, 15360, 40, [N/A], 70.00, [N/A], [N/A]\n")
    assert gpu.power_w is None and gpu.ecc_uncorrected is None and gpu.util_pct == 12


@pytest.fixture
def stand_in_smi(tmp_path):
    """A stand-in nvidia-smi on PATH that prints the H200's recorded answers (without their header)."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    gpu = (RECORDED / "nvidia-smi-query-gpu-h200-busy.csv").read_text().splitlines()[1]
    app = (RECORDED / "nvidia-smi-query-apps-h200-busy.csv").read_text().splitlines()[1].rsplit(",", 2)[0]
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) echo '{gpu}' ;;\n  --query-compute-apps=*) echo '{app}' ;;\n"
                   "  *) exit 9 ;;\nesac\n")
    smi.chmod(0o755)
    return smi.parent


def test_the_probe_runs_in_bash_and_reads_this_machine_and_the_gpu(stand_in_smi):
    proc = subprocess.run(["bash", "-c", probe_command(JOBS)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{stand_in_smi}:{os.environ['PATH']}"})
    sections = split_sections(proc.stdout)
    assert {"t0", "t1", "mem", "jobs", "gpu", "apps", "xid"} <= set(sections), proc.stdout[-2000:] + proc.stderr
    sample = node_sample("here", sections, JOBS)
    assert sample.up and 0 <= sample.cpu_pct <= 100
    assert 0 < sample.mem_used_bytes < sample.mem_total_bytes
    assert sample.net_rx_bps is not None and sample.net_rx_bps >= 0
    (gpu,) = sample.gpus
    assert (gpu.name, gpu.util_pct, gpu.power_w, gpu.power_limit_w) == ("NVIDIA H200", 99, 696.3, 700)
    assert not sample.gpu_error


def test_the_probe_of_a_node_without_nvidia_smi_has_no_gpu_section():
    proc = subprocess.run(["bash", "-c", probe_command(JOBS)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    sections = split_sections(proc.stdout)
    assert "gpu" not in sections and node_sample("here", sections, JOBS).gpus == ()


def _sections(**texts: str) -> dict[str, Section]:
    base = {
        "t0": "cpu  100 0 100 700 100 0 0 0 0 0\neth0: 1000 0 0 0 0 0 0 0 500 0 0 0 0 0 0 0\nlo: 9 0 0 0 0 0 0 0 9",
        "t1": "cpu  150 0 150 800 100 0 0 0 0 0\neth0: 3000 0 0 0 0 0 0 0 1500 0 0 0 0 0 0 0\nlo: 99 0 0 0 0 0 0 0 99",
        "mem": "MemTotal:       1000 kB\nMemAvailable:    250 kB",
        "jobs": f"4343 /opt/pycli/venv/bin/python {JOBS}/20261127-1200-7/workloads/mnist.py --epochs 3\n"
                f"4400 horovodrun -np 2 python {JOBS}/20261127-1200-7/workloads/mnist.py",
    }
    base.update(texts)
    return {name: Section(text, 0) for name, text in base.items()}


def test_a_node_sample_counts_rates_over_the_half_second_and_names_the_job_on_each_gpu():
    gpu = "0, GPU-a, NVIDIA H200, 00000000:3B:00.0, 97, 1000, 143771, 60, 650.00, 700.00, 0, 0x0000000000000004\n" \
          "1, GPU-b, NVIDIA H200, 00000000:10:1C.0, 0, 0, 143771, 31, 75.00, 700.00, 2, 0x0000000000000088"
    xids = (RECORDED / "kernel-log-xid.txt").read_text()
    sample = node_sample("node1", _sections(gpu=gpu, apps="GPU-a, 4343\nGPU-b, 99", xid=xids), JOBS)
    assert sample.cpu_pct == pytest.approx(100 * 100 / 200)  # busy 100 of 200 ticks (iowait counts as idle)
    assert (sample.net_rx_bps, sample.net_tx_bps) == (4000, 2000)  # 2000 and 1000 bytes in 0.5 s; lo left out
    assert (sample.mem_used_bytes, sample.mem_total_bytes) == (750 * 1024, 1000 * 1024)
    assert sample.jobs == ("20261127-1200-7",)
    first, second = sample.gpus
    assert first.jobs == ("20261127-1200-7",) and second.jobs == ()  # pid 99 is no job of pycli's
    # The kernel's Xid lines name the GPU by its bus: 79 on 3b:00 is GPU 0, 63 on 10:1c GPU 1.
    assert (first.last_xid, first.xid_count) == (79, 1) and (second.last_xid, second.ecc_uncorrected) == (63, 2)
    assert first.problem == "Xid 79"  # the software power cap is no fault
    assert second.problem == "Xid 63, 2 uncorrectable ECC, clocks held down by HW Slowdown, HW Power Brake Slowdown"


def test_a_failing_nvidia_smi_is_a_gpu_error_of_the_node():
    broken = Section("Unable to determine the device handle for GPU0: Unknown Error", 15)
    sample = node_sample("node1", {**_sections(), "gpu": broken}, JOBS)
    assert sample.up and sample.gpu_error == "nvidia-smi: Unable to determine the device handle for GPU0: Unknown Error"


def test_a_node_whose_answer_did_not_come_is_down_with_the_reason():
    answers = {"node2": NodeOutput("node2", -9, "", "\nno answer within 5 s"),
               "node3": NodeOutput("node3", 255, "", "ssh: connect to host 10.0.0.3 port 22: No route to host")}
    samples = samples_from_answers(answers, JOBS)
    assert samples["node2"] == NodeSample("node2", False, "no answer within 5 s")
    assert samples["node3"].why == "ssh: connect to host 10.0.0.3 port 22: No route to host"


def _prom(result_by_query: dict) -> str:
    return json.dumps({"address": "10.0.0.1:9090", **result_by_query})


def _vector(*series: tuple[dict, float]) -> list:
    return [{"metric": labels, "value": [1764240000.0, str(value)]} for labels, value in series]


def test_prometheus_answers_make_node_and_gpu_figures_with_the_slurm_job_of_each_gpu():
    dcgm = {"node": "node1", "gpu": "0", "UUID": "GPU-a", "modelName": "NVIDIA H100 80GB HBM3"}
    answers = _prom({
        "up": _vector(({"node": "node1", "job": "node"}, 1), ({"node": "node2", "job": "node"}, 0)),
        "age": _vector(({"node": "node1"}, 3.2), ({"node": "node2"}, 12)),
        "cpu": _vector(({"node": "node1"}, 42.5)),
        "mem_total": _vector(({"node": "node1"}, 4e9)), "mem_available": _vector(({"node": "node1"}, 1e9)),
        "rx": _vector(({"node": "node1"}, 100)), "tx": _vector(({"node": "node1"}, 50)),
        "dcgm_up": _vector(({"node": "node1"}, 1)),
        "gpu_util": _vector(({**dcgm, "hpc_job": "17"}, 88), ({**dcgm, "gpu": "1", "UUID": "GPU-b"}, 0)),
        "fb_used": _vector((dcgm, 1024)), "fb_free": _vector((dcgm, 80000)),
        "gpu_temp": _vector((dcgm, 71)), "power": _vector((dcgm, 512.5)),
        "xid": _vector((dcgm, 0), ({**dcgm, "gpu": "1"}, 48)), "ecc_dbe": _vector((dcgm, 0)),
    })
    samples = parse_answers(answers, ["node1", "node2", "node3"])
    node1 = samples["node1"]
    assert (node1.cpu_pct, node1.mem_used_bytes, node1.net_rx_bps, node1.age_s) == (42.5, 3e9, 100, 3.2)
    first, second = node1.gpus
    assert (first.util_pct, first.mem_used_mib, first.mem_total_mib, first.temp_c, first.jobs) == (88, 1024, 81024, 71, ("17",))
    assert second.problem == "Xid 48" and second.mem_used_mib is None  # only the series that carry it
    assert samples["node2"] == NodeSample("node2", False, "Prometheus could not scrape it (12 s ago)", age_s=12)
    assert not samples["node3"].up and "does not scrape it" in samples["node3"].why


def test_prometheus_that_did_not_answer_is_said_so():
    with pytest.raises(PrometheusUnavailable, match="did not answer: <urlopen error"):
        parse_answers(_prom({"up": {"error": "<urlopen error [Errno 111] Connection refused>"}}), ["node1"])
    with pytest.raises(PrometheusUnavailable, match="nothing printed"):
        parse_answers("", ["node1"])


def test_hostlists_expand_as_slurm_writes_them():
    assert expand_hostlist("node[1-3,7],gpu[08-10]") == ["node1", "node2", "node3", "node7", "gpu08", "gpu09", "gpu10"]
    assert expand_hostlist("node1") == ["node1"] and expand_hostlist("(null)") == []
    assert expand_hostlist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    jobs = parse_squeue("7|ann|RUNNING|None|2|node[1-2]|node1|pycli-train\n8|bob|PENDING|Resources|4|||big\n"
                        "9|eve|RUNNING|None|1|node2|node2|x|y\x1b]0;owned\x07\n")
    # Job 9's name holds a "|" and an escape sequence: it is still job 9, its name made harmless.
    assert running_jobs_by_node(jobs) == {"node1": ["7"], "node2": ["7", "9"]}
    assert jobs[2].name == "x|y?]0;owned?"


def _inventory(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cluster.ini"
    path.write_text("[nodes]\nnode1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2\nnode3 ansible_host=10.0.0.3\n"
                    "[launcher]\nnode1\n" + extra)
    return path


def _view(name: str, up: bool = True, **kwargs) -> NodeSample:
    return NodeSample(name, up, **({"why": "no answer within 5 s"} if not up else {}), **kwargs)


def test_nodes_are_ranked_down_then_gpu_trouble_then_drained_then_hottest(tmp_path):
    cluster = load_cluster(_inventory(tmp_path))
    cluster = cluster.__class__(**{**cluster.__dict__, "drained": (Drained("node1", "bad fan", "2026-11-27T10:00:00Z"),)})
    samples = {"node1": _view("node1", cpu_pct=5), "node2": _view("node2", gpus=(GpuSample(0, last_xid=79),)),
               "node3": _view("node3", up=False)}
    side = ClusterSide(slurm={"node2": NodeState("node2", "mixed", 8, "none")}, slurm_jobs={"node2": ["17"]})
    views = node_views(cluster, samples, side)
    assert [v.state for v in views] == ["drained", "mixed", "down"]
    frame = Frame("ssh", "SSH", views)
    assert [v.name for v in frame.worst_first()] == ["node3", "node2", "node1"]
    assert views[1].jobs == ("17",) and views[1].as_json()["gpus"][0]["problem"] == "Xid 79"


def _drawn(frame: Frame, height: int) -> str:
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(render(frame, "cluster.ini", height))
    return console.export_text()


def test_the_view_shows_a_line_per_gpu_and_past_a_screenful_the_worst_nodes_first():
    gpus = tuple(GpuSample(i, "NVIDIA H200", util_pct=90, temp_c=60 + i) for i in range(8))
    nodes = tuple(NodeView(_view(f"node{n}", cpu_pct=10, gpus=gpus)) for n in range(1, 21))
    nodes = (*nodes[:7], NodeView(_view("node8", up=False)), *nodes[8:])
    frame = Frame("prometheus", "Prometheus on node1", nodes, notes=("Slurm: asking on node1 failed: timeout",))
    full = _drawn(Frame("ssh", "SSH", nodes[:2]), height=60)
    assert full.count("NVIDIA H200") == 16 and "7 NVIDIA H200" in full
    brief = _drawn(frame, height=20)
    lines = [line for line in brief.splitlines() if line.startswith("node") and line[4].isdigit()]
    assert lines[0].startswith("node8") and "down: no answer within 5 s" in lines[0]
    assert "8 GPUs" in lines[1] and "max 67C" in lines[1] and len(lines) < 20
    assert "more" in brief and "Slurm: asking on node1 failed" in brief and "1 down, 19 up" in brief


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    inventory = _inventory(tmp_path)
    for args, message in ((["--source", "carrier-pigeon"], "--source 'carrier-pigeon': give one of auto, prometheus, ssh"),
                          (["--interval", "0"], "--interval 0: give seconds from 0.5 to 3600"),
                          (["--timeout", "-1"], "--timeout -1: give seconds above 0"),
                          (["--source", "prometheus"], "this inventory has no [monitoring] group")):
        assert main(["top", str(inventory), "--once", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    with pytest.raises(BadInput):
        TopRequest(source="prometheus").check(load_cluster(inventory))
    assert TopRequest().uses_prometheus(load_cluster(_inventory(tmp_path, "[monitoring]\nnode1\n")))
    assert not TopRequest(source="ssh").uses_prometheus(load_cluster(_inventory(tmp_path, "[monitoring]\nnode1\n")))


def test_the_jobs_folder_is_the_one_jobs_run_in():
    assert str(JOBS).endswith("/jobs") and JOBS == PurePosixPath(NodeLayout().work_dir) / "jobs"
