"""make test's timings table (tests/timings.py): the pytest plugin, the step runner, the report."""

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT
from tests.timings import Row, read_rows, report, run_step, write_rows

SAMPLE = textwrap.dedent("""
    import time
    import pytest

    @pytest.fixture(scope="session")
    def slow_setup():
        time.sleep(0.3)

    def test_first_pays_the_setup(slow_setup):
        sum(range(2_000_000))

    def test_second_does_not(slow_setup):
        pass

    def test_fails():
        assert False
""")


def test_the_plugin_writes_a_row_per_test_with_its_setup_call_and_outcome(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    table = tmp_path / "timings" / "part.tsv"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-p", "tests.timings", str(tmp_path / "test_sample.py"), "--timings", str(table)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one test fails
    rows = {row.entry.rsplit("::", 1)[1]: row for row in read_rows(table.parent)}
    assert set(rows) == {"test_first_pays_the_setup", "test_second_does_not", "test_fails"}
    first, second = rows["test_first_pays_the_setup"], rows["test_second_does_not"]
    assert first.part == "part" and first.setup_s >= 0.3 > second.setup_s
    # The table rounds each figure to 0.01 s on its own: their sum can pass the rounded wall by 0.01.
    assert first.wall_s >= first.setup_s + first.call_s - 0.015 and first.cpu_s > 0
    # The machine's idle core-seconds while each ran (/proc/stat): measured, never more than all cores.
    cores = os.cpu_count() or 1
    assert all(row.idle_s is not None and 0 <= row.idle_s <= row.wall_s * cores + 0.5 for row in rows.values()), rows
    assert rows["test_fails"].outcome == "failed" and first.outcome == "passed"


def test_a_step_that_is_not_pytest_gets_its_row_and_keeps_its_exit_code(tmp_path):
    table = tmp_path / "lint.tsv"
    assert run_step(table, "lint", "ok", [sys.executable, "-c", "pass"]) == 0
    assert run_step(table, "lint", "broken", [sys.executable, "-c", "raise SystemExit(3)"]) == 3
    rows = read_rows(tmp_path)
    assert [(r.entry, r.outcome) for r in rows] == [("ok", "passed"), ("broken", "failed")]
    assert all(r.wall_s > 0 and r.call_s == r.wall_s for r in rows)


def test_the_report_puts_the_largest_first_and_sums_each_part(tmp_path):
    write_rows(tmp_path / "unit.tsv", [Row("unit", "a", wall_s=1.0), Row("unit", "b", wall_s=90.0, setup_s=80.0)])
    write_rows(tmp_path / "molecule.tsv", [Row("molecule", "gpu\tfixture", wall_s=30.0)])
    text = report(tmp_path, top=2, markdown=False)
    lines = text.splitlines()
    assert lines[0].endswith("the 2 largest of 3 entries")
    assert lines[2].split() == ["90.0", "0.0", "80.0", "-", "unit:", "b"]  # "-": no idle figure
    assert lines[3].endswith("molecule: gpu fixture")  # a tab in an id cannot break the table
    assert "unit 1 min 31 s" in lines[-1] and "molecule 30.0 s" in lines[-1]
    assert "| unit | 1 min 31 s |" in report(tmp_path, top=2, markdown=True)


def test_the_report_names_the_entries_that_left_the_machine_most_idle_and_reads_tables_without_the_column(tmp_path):
    write_rows(tmp_path / "integration.tsv", [Row("integration", "busy", wall_s=50.0, idle_s=2.0),
                                              Row("integration", "waits", wall_s=40.0, idle_s=70.0),
                                              Row("integration", "unmeasured", wall_s=30.0)])
    # A table written before the idle column: its rows read, with no idle figure.
    (tmp_path / "old.tsv").write_text("part\tentry\toutcome\twall_s\tcpu_s\tsetup_s\tcall_s\tteardown_s\n"
                                      "old\tstep\tpassed\t5.00\t1.00\t0.00\t5.00\t0.00\n")
    rows = {row.entry: row for row in read_rows(tmp_path)}
    assert rows["waits"].idle_s == 70.0 and rows["unmeasured"].idle_s is None and rows["step"].idle_s is None
    assert rows["step"].wall_s == 5.0
    lines = report(tmp_path, top=3, markdown=False).splitlines()
    assert lines[2].split()[3] == "2.0" and lines[3].split()[3] == "70.0"
    idle = next(line for line in lines if line.startswith("the machine's idle core-seconds"))
    assert idle.index("integration: waits 70") < idle.index("integration: busy 2")
    assert "unmeasured" not in idle and "step" not in idle
    assert "| integration: `waits` | 40.0 | 0.0 | 0.0 | 70.0 |" in report(tmp_path, top=3, markdown=True)


def test_the_play_that_starts_make_test_s_other_parts_is_one_of_site_yml(tmp_path):
    """make test holds unit, molecule and lint until the first provisioning reaches this play (the
    first after the Open MPI build's start); renamed in site.yml, they would wait for the whole
    provisioning instead, and the run grow by minutes. Its watcher touches the file on that play."""
    import threading

    import yaml

    from tests.integration.conftest import SIDE_GO_PLAY, _say_when_the_build_runs

    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    names = [play.get("name") for play in plays]
    assert SIDE_GO_PLAY in names and names.index(SIDE_GO_PLAY) > names.index(
        "Start the Open MPI build where nothing waits for CUDA")
    events = tmp_path / "20261129-000000-provision" / "artifacts" / "x" / "job_events"
    events.mkdir(parents=True)
    (events / "1-a.json").write_text(json.dumps({"event": "playbook_on_play_start", "event_data": {"play": "Other"}}))
    marker, ended = tmp_path / "side.go", threading.Event()
    watcher = threading.Thread(target=_say_when_the_build_runs, args=(tmp_path, marker, ended), daemon=True)
    watcher.start()
    watcher.join(3)
    assert not marker.exists()
    (events / "2-b.json").write_text(json.dumps({"event": "playbook_on_play_start", "event_data": {"play": SIDE_GO_PLAY}}))
    watcher.join(5)
    assert marker.exists() and not watcher.is_alive()
