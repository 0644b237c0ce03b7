"""recap.json, check.json and results.json carry the version of their layout, and a reader
refuses one it does not know in one line (exit 2) rather than misread it."""

import json
from datetime import datetime
from pathlib import Path

import pytest

from pycli.bench.plan import BenchRequest
from pycli.bench.report import write_report
from pycli.bench.results import results_document
from pycli.cluster.model import Cluster, Host
from pycli.core.errors import EXIT_BAD_INPUT, BadInput
from pycli.core.json_documents import CHECK, RECAP, RESULTS, read_document, versioned
from pycli.health.gates import GateResult
from pycli.health.run import report_json
from pycli.provision.recap import last_unfinished, write_recap


def _cluster(tmp_path) -> Cluster:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[nodes]\nnode1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2\n")
    return Cluster(hosts=(Host("node1", "10.0.0.1"), Host("node2", "10.0.0.2")), launcher="node1", inventory=inventory)


def _results(run_dir: Path) -> dict:
    return results_document(
        inventory=run_dir / "inv.ini", request=BenchRequest(), run_dir=run_dir, started=datetime(2026, 1, 1),
        seconds=1.0, interrupted=False, nodes=[], summaries=[], skipped=[], allreduce_runs=[], allreduce_skipped=[],
        tcp=None,
    )


def _write(folder: Path, name: str, document: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(document))
    return path


# --- the writers -------------------------------------------------------------------------


def test_recap_json_is_written_with_its_version_first(tmp_path):
    path = write_recap(tmp_path, _cluster(tmp_path), {"node1": "ok"})
    assert path.name == RECAP.file_name
    assert list(json.loads(path.read_text()).items())[0] == ("version", 1)


def test_check_json_carries_its_version(tmp_path):
    summary = report_json(Path("inv.ini"), tmp_path, [GateResult("reach", "pass")])
    assert list(summary.items())[0] == ("version", 1) and summary["passed"] is True


def test_results_json_carries_its_version_as_written(tmp_path):
    write_report(_results(tmp_path), tmp_path)
    assert list(json.loads((tmp_path / RESULTS.file_name).read_text()).items())[0] == ("version", 1)


def test_versioned_puts_the_writers_version_over_any_given():
    assert versioned(CHECK, {"a": 1, "version": 9}) == {"version": 1, "a": 1}


# --- the readers -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [RECAP, CHECK, RESULTS], ids=lambda kind: kind.file_name)
def test_each_document_as_written_reads_back(tmp_path, kind):
    path = _write(tmp_path / "run", kind.file_name, versioned(kind, {"x": 1}))
    assert read_document(kind, path) == {"version": 1, "x": 1}


@pytest.mark.parametrize("kind", [RECAP, CHECK, RESULTS], ids=lambda kind: kind.file_name)
@pytest.mark.parametrize("version", [7, 0, "1", True, 1.0, None])
def test_a_version_this_pycli_does_not_know_is_refused_in_one_line(tmp_path, kind, version):
    path = _write(tmp_path / "run", kind.file_name, {"version": version, "hosts": {}})
    with pytest.raises(BadInput) as caught:
        read_document(kind, path)
    assert str(caught.value) == f"{kind.file_name} at {tmp_path / 'run'} has version {version!r}; this pycli reads version 1"
    assert caught.value.exit_code == EXIT_BAD_INPUT


def test_only_a_recap_may_come_without_a_version_as_run_folders_from_before_hold_them(tmp_path):
    assert read_document(RECAP, _write(tmp_path / "old", "recap.json", {"hosts": {}})) == {"hosts": {}}
    for kind in (CHECK, RESULTS):
        path = _write(tmp_path / "old", kind.file_name, {"passed": True})
        with pytest.raises(BadInput, match=rf"^{kind.file_name} at .*old has no version; this pycli reads version 1$"):
            read_document(kind, path)


def _recap(runs: Path, name: str, inventory: Path, hosts: dict, age: int, **extra) -> None:
    import os

    path = _write(runs / name, "recap.json", {**extra, "inventory": str(inventory.resolve()), "hosts": hosts})
    os.utime(path, (age, age))


def test_retry_refuses_the_newest_recap_of_its_inventory_from_another_version(tmp_path):
    cluster, runs = _cluster(tmp_path), tmp_path / "runs"
    _recap(runs, "20260101-provision", cluster.inventory_path, {"node1": "FAILED"}, 1000, version=1)
    _recap(runs, "20260102-provision", cluster.inventory_path, {"node2": "FAILED"}, 2000, version=7)
    with pytest.raises(BadInput) as caught:
        last_unfinished(cluster, runs)
    assert str(caught.value) == f"recap.json at {runs / '20260102-provision'} has version 7; this pycli reads version 1"


def test_retry_passes_over_other_inventories_and_takes_up_a_recap_from_before_versions(tmp_path):
    cluster, runs = _cluster(tmp_path), tmp_path / "runs"
    _recap(runs, "20260101-provision", cluster.inventory_path, {"node1": "ok", "node2": "FAILED"}, 1000)  # no version
    _recap(runs, "20260102-provision", tmp_path / "other.ini", {"node1": "FAILED"}, 2000, version=7)
    assert last_unfinished(cluster, runs) == (runs / "20260101-provision", ["node2"])
