"""Job folders on the nodes: staging a job keeps the newest `pycli_jobs_kept` of them, and a
--docker job's container files (its private keys) go when the job ends.

The playbooks' own tasks run here through Ansible on temporary folders, as a node runs them."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_tasks_locally

ROOT = Path(__file__).resolve().parents[2]
RETENTION_TASK = "Remove the oldest job folders"


def playbook_task(playbook: str, name: str) -> dict:
    (play,) = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    (task,) = [t for t in play["tasks"] if t.get("name") == name]
    return task


def job_ids(count: int) -> list[str]:
    """Job ids as pycli makes them (time-pid), oldest first; two share a second."""
    ids = [f"20261124-{10 + i // 60:02d}{i % 60:02d}00-{100 + i}" for i in range(count)]
    ids.append(ids[-1].rsplit("-", 1)[0] + "-99")  # same second, shorter pid: numerically older
    return ids


@pytest.fixture
def jobs(tmp_path) -> Path:
    folder = tmp_path / "srv" / "jobs"
    for job in job_ids(25):
        (folder / job / "checkpoints").mkdir(parents=True)
        (folder / job / "metrics.jsonl").write_text("{}\n")
    (folder / "notes").mkdir()  # not a job folder pycli made: never touched
    return folder


def stage_retention(jobs: Path, current: str, tmp_path: Path, **extravars) -> dict:
    (current_dir := jobs / current).mkdir(exist_ok=True)
    (result,) = run_tasks_locally([playbook_task("stage.yml", RETENTION_TASK)],
                                  {"pycli_job_dir": str(current_dir), **extravars}, tmp_path)
    return result


def test_staging_keeps_the_newest_job_folders_and_this_job(jobs, tmp_path):
    current = "20261124-200000-7"
    result = stage_retention(jobs, current, tmp_path, pycli_jobs_kept=20)
    assert not result.get("failed"), result
    ids = job_ids(25)
    kept = sorted(p.name for p in jobs.iterdir())
    # 20 in all: this job and the 19 newest before it; "-99" is older than "-124" of the same second.
    by_age = sorted(ids, key=lambda j: (j.rsplit("-", 1)[0], int(j.rsplit("-", 1)[1])))
    assert kept == sorted([*by_age[-19:], current, "notes"])
    assert result["changed"] and sorted(result["stdout_lines"]) == sorted(by_age[:-19])
    again = stage_retention(jobs, current, tmp_path, pycli_jobs_kept=20)
    assert not again["changed"] and sorted(p.name for p in jobs.iterdir()) == kept


def test_the_default_keeps_twenty_and_zero_keeps_all(jobs, tmp_path):
    stage_retention(jobs, "20261124-200000-7", tmp_path, pycli_jobs_kept=0)
    assert len(list(jobs.iterdir())) == 26 + 2  # with "notes" and this job
    result = stage_retention(jobs, "20261124-200000-7", tmp_path)
    assert result["changed"] and len([p for p in jobs.iterdir() if p.name != "notes"]) == 20


def test_a_job_folder_a_running_process_names_is_kept(jobs, tmp_path):
    oldest = job_ids(25)[0]
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(jobs / oldest / "workloads" / "x.py")])
    try:
        stage_retention(jobs, "20261124-200000-7", tmp_path, pycli_jobs_kept=5)
        assert (jobs / oldest).is_dir() and len([p for p in jobs.iterdir() if p.name != "notes"]) == 6
    finally:
        running.kill()
        running.wait()


@pytest.mark.parametrize("kept", ["many", "-1", "2.5"])
def test_a_count_that_is_no_whole_number_fails_staging_with_its_name(jobs, tmp_path, kept):
    result = stage_retention(jobs, "20261124-200000-7", tmp_path, pycli_jobs_kept=kept)
    assert result["failed"] and "pycli_jobs_kept" in result["stderr"]
    assert len(list(jobs.iterdir())) == 26 + 2


def test_the_end_of_a_docker_job_removes_its_container_files_from_the_node(tmp_path):
    job_dir = tmp_path / "srv" / "jobs" / "20261124-200000-7"
    (job_dir / "container").mkdir(parents=True)
    (job_dir / "container" / "id_ed25519").write_text("PRIVATE")
    (job_dir / "metrics.jsonl").write_text("{}\n")
    task = playbook_task("job_container.yml", "Remove the job's container files (its private keys)")
    assert task["when"] == "pycli_container_state == 'absent'"
    # Before `docker rm`: a node whose Docker does not answer loses the keys too.
    assert yaml.safe_load((ROOT / "playbooks" / "job_container.yml").read_text())[0]["tasks"][0] == task
    first, second = (run_tasks_locally([task], {"pycli_job_dir": str(job_dir), "pycli_container_state": "absent"}, tmp_path)[0]
                     for _ in range(2))
    assert first["changed"] and not second["changed"]
    assert not (job_dir / "container").exists() and (job_dir / "metrics.jsonl").exists()


# --- what pycli does with them -----------------------------------------------------------------


def _cluster(tmp_path):
    from pycli.cluster_model import Cluster, Host

    hosts = (Host("n1", "10.9.0.1", user="root", slots=2), Host("n2", "10.9.0.2", user="root", slots=2))
    return Cluster(hosts=hosts, launcher="n1", inventory=tmp_path / "inventory.ini")


def test_a_docker_job_whose_staging_fails_still_removes_what_reached_the_nodes(tmp_path, monkeypatch):
    from pycli import train
    from pycli.containers import JobContainer
    from pycli.errors import PycliError

    removed = []

    def failing_stage(plan, inventory, run_dir, container_files=None):
        raise PycliError("staging the job failed: n2: disk full")

    monkeypatch.setattr(train, "stage", failing_stage)
    monkeypatch.setattr(train, "remove_containers", lambda plan, inventory, run_dir: removed.append(plan.job_id))
    request = train.JobRequest(np=4, workload="synthetic", container=JobContainer("img"))
    with pytest.raises(PycliError, match="disk full"):
        train.run_job(_cluster(tmp_path), request, run_dir=tmp_path / "run", write=lambda line: None)
    assert len(removed) == 1
    assert not any((tmp_path / "run" / "container").glob("id_*"))  # nor on the controller


def test_old_job_folders_a_node_cannot_remove_are_said(tmp_path, monkeypatch, capsys):
    from pycli import train
    from pycli.launch_lines import NodeLayout

    def fake_playbook(inventory, playbook, run_dir, extravars, limit, what, on_event=None):
        on_event({"event": "runner_on_ok", "event_data": {"host": "n2", "task": RETENTION_TASK, "res": {
            "stdout": "", "stderr": "rm: cannot remove '20261124-100000-100/checkpoints/last.pt': Permission denied"}}})
        on_event({"event": "runner_on_ok", "event_data": {"host": "n1", "task": RETENTION_TASK, "res": {
            "stdout": "20261124-100000-101", "stderr": ""}}})

    monkeypatch.setattr(train, "_run_playbook", fake_playbook)
    plan = train.plan_job(_cluster(tmp_path), train.JobRequest(np=4, workload="synthetic"), layout=NodeLayout(), job_id="j1")
    train.stage(plan, tmp_path / "inventory.ini", tmp_path)
    err = capsys.readouterr().err
    assert err == ("pycli: warning: n2 keeps old job folders it cannot remove (pycli_jobs_kept): "
                   "rm: cannot remove '20261124-100000-100/checkpoints/last.pt': Permission denied\n")


def test_the_task_pycli_reads_is_the_one_in_the_playbook():
    from pycli import train

    assert train.RETENTION_TASK == RETENTION_TASK and playbook_task("stage.yml", RETENTION_TASK)
