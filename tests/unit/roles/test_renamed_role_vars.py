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


@pytest.mark.slow_ansible
@pytest.mark.parametrize("old", ["gpu_matrix", "gpu_cuda_min_driver_branch"])
def test_an_inventory_that_still_carries_the_gpu_matrix_file_stops_in_one_line(tmp_path, old):
    """The GPU stacks' table moved from inventory/group_vars/all/gpu_matrix.yml to role
    gpu_preflight's defaults: a copy of the old file beside an inventory is named, not used."""
    tasks = yaml.safe_load((ROLES / "gpu_preflight" / "tasks" / "matrix.yml").read_text())
    [task] = [task for task in tasks if old in str(task.get("ansible.builtin.assert", {}).get("that", ""))]
    [passed] = run_tasks_locally([task], {"gpu_stack": "r580-cuda12.8"}, tmp_path)
    assert not passed.get("failed"), passed
    [refused] = run_tasks_locally([task], {old: {"12.8": 570}}, tmp_path)
    assert refused.get("failed") and "gpu_matrix is now gpu_preflight_matrix" in refused["msg"], refused
    assert "\n" not in refused["msg"].strip()
