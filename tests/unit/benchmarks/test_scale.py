"""benchmarks/scale.py: the line it fits, the tasks it counts, and its refusal of bad sizes."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "scale.py"


def load_scale():
    spec = importlib.util.spec_from_file_location("scale_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


scale = load_scale()


def test_fit_recovers_a_line_and_predicts_from_it():
    a, b = scale.fit([(1, 7.0), (2, 9.0), (4, 13.0), (8, 21.0), (16, 37.0)])
    assert a == pytest.approx(5.0)
    assert b == pytest.approx(2.0)
    assert a + b * 512 == pytest.approx(1029.0)


def test_fit_of_a_constant_has_no_slope():
    assert scale.fit([(1, 43.0), (4, 43.0), (16, 43.0)]) == pytest.approx((43.0, 0.0))


def test_fit_of_one_size_is_flat_through_its_mean():
    assert scale.fit([(2, 8.0), (2, 10.0)]) == (9.0, 0.0)


def test_fit_of_noisy_points_is_least_squares():
    a, b = scale.fit([(0, 1.0), (1, 0.0), (2, 3.0)])
    assert b == pytest.approx(1.0)
    assert a == pytest.approx(1.0 / 3.0)


def write_event(folder: Path, number: int, event: str, host: str) -> None:
    path = folder / "artifacts" / "run-id" / "job_events" / f"{number}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"event": event, "event_data": {"host": host}}))


def test_tasks_and_loop_items_per_host_are_counted_apart_and_the_controller_not_at_all(tmp_path):
    for number, (event, host) in enumerate([
        ("runner_on_ok", "node1"), ("runner_on_skipped", "node1"), ("runner_on_failed", "node1"),
        ("runner_item_on_ok", "node1"), ("runner_item_on_ok", "node1"),
        ("runner_on_ok", "node2"), ("runner_on_unreachable", "node3"),
        ("runner_on_start", "node2"), ("runner_on_ok", "localhost"),
    ]):
        write_event(tmp_path, number, event, host)
    assert scale.per_host(tmp_path, scale.TASK_EVENTS) == {"node1": 3, "node2": 1, "node3": 1}
    assert scale.per_host(tmp_path, scale.ITEM_EVENTS) == {"node1": 2}


@pytest.mark.parametrize("nodes", ["0,2", "1,,2", "two", "1;2", ""])
def test_bad_sizes_are_one_line_and_exit_2(nodes):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nodes", nodes], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--nodes takes sizes of at least 1 separated by commas" in proc.stderr.strip().splitlines()[-1]


def test_a_tag_stage_runs_site_yml_and_an_artifact_stage_the_fan_out_playbook(tmp_path):
    assert scale.stage_argv("ssh_trust", tmp_path / "x") == ["--tags", "ssh_trust"]
    entry = tmp_path / "artifacts" / "scale-1mb"
    fanned = scale.stage_argv("artifact", entry)
    assert fanned[:2] == ["--playbook", "playbooks/fanout.yml"] and f"fanout_entry={entry}" in fanned
    assert "artifact_cache_fanout=false" not in fanned
    direct = scale.stage_argv("artifact-from-controller", entry)
    assert direct[-2:] == ["-e", "artifact_cache_fanout=false"]
    assert direct[direct.index("-e", 3) + 1] != fanned[fanned.index("-e", 3) + 1]  # each stage its own node path


def test_a_cache_stage_runs_with_the_package_cache_on_a_cluster_of_its_own(tmp_path):
    assert scale.stage_argv("common+cache", tmp_path) == ["--tags", "package_cache,common"]
    # The whole site.yml has the cache's play in it already: no tags, with or without the cache.
    assert scale.stage_argv("site", tmp_path) == scale.stage_argv("site+cache", tmp_path) == []
    assert scale.clusters([1, 4], ["common", "common+cache", "ssh_trust"]) == [
        (1, False, ["common", "ssh_trust"]), (1, True, ["common+cache"]),
        (4, False, ["common", "ssh_trust"]), (4, True, ["common+cache"]),
    ]
    assert scale.clusters([2], ["common+cache"]) == [(2, True, ["common+cache"])]
    # The comparison: the same stage without the cache, at the sizes asked, in the same run.
    assert scale.clusters([1, 8], ["common+cache", "ssh_trust"], frozenset({8, 32})) == [
        (1, False, ["ssh_trust"]), (1, True, ["common+cache"]),
        (8, False, ["ssh_trust", "common"]), (8, True, ["common+cache"]),
        (32, False, ["common"]),
    ]


def test_the_artifact_is_a_whole_cache_entry(tmp_path):
    entry = scale.make_artifact(tmp_path, 2)
    check = subprocess.run([str(ROOT / "roles" / "artifact_cache" / "files" / "cache_entry.sh"), "check", str(entry)],
                           capture_output=True, text=True, check=True)
    assert entry.stat().st_size == 2_000_000 and len(check.stdout.strip()) == 64


def test_a_bad_artifact_size_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "1", "--artifact-mb", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--artifact-mb takes a size of at least 1" in proc.stderr.strip().splitlines()[-1]
