"""Role variables renamed since 0.2.0: a run that still sets the old name stops in the role's
preflight, in one line naming the new one; a run that does not passes the check."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT, run_tasks_locally

ROLES = ROOT / "roles"
RENAMED = [
    ("slurm", "slurm_node_gate_dir", "pycli_node_dir"),
    ("monitoring", "monitoring_dcgm_job_mapping_dir", "pycli_node_dcgm_job_mapping_dir"),
]


def _check(role: str, old: str) -> dict:
    tasks = yaml.safe_load((ROLES / role / "tasks" / "preflight.yml").read_text())
    [task] = [task for task in tasks if old in str(task.get("ansible.builtin.assert", {}).get("that", ""))]
    return task


@pytest.mark.slow_ansible
@pytest.mark.parametrize(("role", "old", "new"), RENAMED)
def test_the_old_name_stops_the_run_in_one_line_naming_the_new_one(tmp_path, role, old, new):
    task = {**_check(role, old)}
    task.pop("run_once", None)
    [passed] = run_tasks_locally([task], {}, tmp_path)
    assert not passed.get("failed"), passed
    [refused] = run_tasks_locally([task], {old: "/srv/somewhere"}, tmp_path)
    assert refused.get("failed"), refused
    assert refused["msg"].startswith(f"{old} is now {new}") and f"set {new}=/srv/somewhere instead" in refused["msg"]
    assert "\n" not in refused["msg"].strip()
