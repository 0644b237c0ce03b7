"""workloads/allreduce.py: sizes, nccl-tests' bandwidth definitions, and real runs under torchrun (Gloo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

WORKLOADS = ROOT / "workloads"
sys.path.insert(0, str(WORKLOADS))

import allreduce  # noqa: E402
from wl_errors import WorkloadError  # noqa: E402

TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_size_ladder_doubles_from_min_to_max_in_binary_units():
    assert allreduce.size_ladder("4K:64K") == [4096, 8192, 16384, 32768, 65536]
    assert allreduce.size_ladder("4K:256M")[-1] == 256 * 2**20 and len(allreduce.size_ladder("4K:256M")) == 17
    assert allreduce.size_ladder("1K,1M") == [1024, 2**20]


@pytest.mark.parametrize(("spec", "message"), [
    ("4K:1K", "MIN <= MAX"), ("6", "whole number of float32"), ("x", "not a number"), ("", "names no size"),
])
def test_bad_sizes_are_refused(spec, message):
    with pytest.raises(WorkloadError, match=message):
        allreduce.size_ladder(spec)


@pytest.mark.parametrize(("ranks", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_factor_is_nccl_tests_2_n_minus_1_over_n(ranks, factor):
    assert allreduce.bus_factor(ranks) == factor


def test_bandwidths_follow_from_the_times():
    record = allreduce.size_record(2**30, 4, [0.5, 0.5])
    assert record["algbw_gbps"] == pytest.approx(2**30 / 0.5 / 1e9)
    assert record["busbw_gbps"] == pytest.approx(record["algbw_gbps"] * 1.5)
    assert record["time_s_ci95"] == 0 and record["busbw_gbps_ci95"] == 0
    spread = allreduce.size_record(1000, 2, [1.0, 3.0])
    assert spread["time_s"] == 2.0 and spread["algbw_gbps_ci95"] == pytest.approx(spread["algbw_gbps"] * spread["time_s_ci95"] / 2.0)


def test_a_wrong_sum_is_counted_element_by_element():
    buffer = torch.full((8,), 3.0)
    assert allreduce.wrong_elements(buffer, 3.0) == 0
    buffer[2] = 2.0
    buffer[5] = float("nan")
    assert allreduce.wrong_elements(buffer, 3.0) == 2


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow_torch
def test_two_ranks_under_torchrun_gloo_give_a_correct_record_per_size(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(WORKLOADS / "allreduce.py"),
           "--comm", "torch", "--backend", "gloo", "--sizes", "4K:64K", "--warmup", "1", "--iters", "3",
           "--metrics", "ar.jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(tmp_path / "ar.jsonl")
    assert [r["bytes"] for r in records] == [4096, 8192, 16384, 32768, 65536]
    for record in records:
        assert record["correct"] and record["ranks"] == 2 and record["hosts"] == 1
        assert (record["comm"], record["backend"], record["device"]) == ("torch", "gloo", "cpu")
        assert record["time_s"] > 0 and record["busbw_gbps"] == pytest.approx(record["algbw_gbps"])  # 2(n-1)/n = 1
    assert "via torch/gloo" in proc.stdout


@pytest.mark.slow_torch
def test_a_world_of_one_moves_nothing_over_the_bus(tmp_path):
    cmd = [sys.executable, str(WORKLOADS / "allreduce.py"), "--comm", "torch", "--backend", "gloo", "--sizes", "4K",
           "--iters", "2", "--metrics", "one.jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (record,) = _records(tmp_path / "one.jsonl")
    assert record["ranks"] == 1 and record["busbw_gbps"] == 0 and record["algbw_gbps"] > 0


@pytest.mark.slow_torch
@pytest.mark.parametrize(("args", "message"), [
    (["--iters", "1"], "--iters at least 2"),
    (["--sizes", "5"], "whole number of float32"),
    (["--comm", "horovod", "--backend", "gloo"], "--backend is for --comm torch"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(WORKLOADS / "allreduce.py"), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
