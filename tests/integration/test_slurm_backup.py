"""A backup Slurm controller on the local cluster (docs/day-two.md): node2 added to group
slurm_controller below node1, slurmctld's state moved onto the folder every node shares
(pycli.local.plan.SHARED_DIR, as NFS on a real cluster), all under a running job; the primary's
daemons stopped under it: sbatch, squeue and `pycli jobs` go on through the backup, the job
ends under its own id; the primary back takes over again, and the cluster goes back to one
controller, its state moved back, again under a job."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from pycli.local.plan import SHARED_DIR
from tests.conftest import run_pycli
from tests.integration.conftest import node_run
from tests.integration.test_slurm import DECLARED, sacct

pytestmark = [pytest.mark.integration, pytest.mark.lane("slurm")]  # its own lane under make test (conftest.py)

STATE = f"{SHARED_DIR}/slurm/state"
DEFAULT_STATE = "/var/lib/slurm/slurmctld"  # the role's default
TAKEOVER_AT_MOST_S = 30  # docs/day-two.md; the bed's slurm_ctld_timeout is 10 s


def _inventory(provisioned: Path, path: Path, controllers: list[str], settings: dict[str, str]) -> Path:
    """The session's nodes as a Slurm cluster (4 slots a node, as test_slurm.py's) with these controllers."""
    text = provisioned.read_text().split(DECLARED)[0].replace("\nslots=1\n", "\nslots=4\n")
    assert "\nslots=4\n" in text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n[slurm_controller]\n" + "".join(f"{name}\n" for name in controllers)
                    + (DECLARED + "".join(f"{key}={value!r}\n" for key, value in settings.items()) if settings else ""))
    return path


def _sbatch(node: str, *args: str) -> tuple[int, str]:
    return node_run(node, "sbatch", "--parsable", "--nodelist=node2", "--time=10", *args)


def _sbatch_once_it_answers(node: str, what: str, timeout_s: float) -> str:
    """A job that runs `true` on node2, submitted on `node` as soon as Slurm takes it; its id."""
    deadline = time.monotonic() + timeout_s
    while (answer := _sbatch(node, "--wrap", "true"))[0] != 0:
        assert time.monotonic() < deadline, f"sbatch through {what}: not within {timeout_s:.0f} s: {answer[1]}"
        time.sleep(0.5)
    return answer[1].strip()


def _running(command: str) -> str:
    """A job of `command` on node2, submitted on node1, once it runs; its id."""
    code, job_id = _sbatch("node1", "--wrap", command)
    assert code == 0, job_id
    job_id = job_id.strip()
    _wait(f"job {job_id} RUNNING", lambda: _job_state(job_id) == "RUNNING", 60)
    return job_id


def _job_state(job_id: str) -> str:
    code, out = node_run("node1", "scontrol", "-o", "show", "job", job_id)
    found = re.search(r"\bJobState=(\S+)", out)
    assert code == 0 and found, out
    return found.group(1)


def _wait(what: str, test, timeout_s: float, interval_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while not (result := test()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(interval_s)
    return result


def _ping() -> str:
    return node_run("node1", "scontrol", "ping")[1]


def _provision(inventory: Path) -> None:
    started = time.monotonic()
    proc = run_pycli("provision", str(inventory), "--tags", "slurm", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    print(f"\nslurm role ({inventory.parent.name}): {time.monotonic() - started:.0f} s")


def test_a_backup_controller_takes_over_under_a_running_job_and_the_primary_takes_back_over(provisioned_cluster, tmp_path):
    backup = _inventory(provisioned_cluster, tmp_path / "backup" / "slurm.ini", ["node1", "node2"],
                        {"slurm_state_save_location": STATE})
    single = _inventory(provisioned_cluster, tmp_path / "single" / "slurm.ini", ["node1"], {})
    if node_run("node1", "test", "-e", "/etc/slurm/slurm.conf")[0] != 0:  # run alone, without test_slurm.py's
        _provision(single)  # one controller, its state in the default folder, as test_slurm.py leaves it

    # A job runs while the backup comes and the state moves onto the shared folder: it goes on.
    moved = _running("sleep 45")
    _provision(backup)
    conf = node_run("node2", "cat", "/etc/slurm/slurm.conf")[1]
    assert re.findall(r"^SlurmctldHost=(\w+)\(", conf, re.M) == ["node1", "node2"], conf
    assert f"\nStateSaveLocation={STATE}\n" in conf and "\nSlurmctldTimeout=10\n" in conf, conf
    assert "Slurmctld(primary) at node1 is UP" in _ping() and "Slurmctld(backup) at node2 is UP" in _ping()
    assert _job_state(moved) == "RUNNING"
    # The old folder's files are kept aside, not left where a later move back would take them for a state.
    code, old = node_run("node1", "sh", "-c", f"ls -A {DEFAULT_STATE}; ls {STATE}")
    assert code == 0 and re.search(r"^\.moved-\d{8}-\d{6}$", old, re.M) and "job_state" in old, old
    # A job that starts now knows both controllers (its slurmstepd reads slurm.conf as it starts).
    job = _running("sleep 40")

    # The primary's daemons stop (slurmctld and slurmdbd): the backup takes over within the timeout.
    stopped = time.monotonic()
    code, out = node_run("node1", "systemctl", "stop", "slurmctld", "slurmdbd")
    assert code == 0, out
    second = _sbatch_once_it_answers("node1", "the backup", 90)
    takeover = time.monotonic() - stopped
    print(f"\nthe backup took over in {takeover:.0f} s (sbatch answered again)")
    assert takeover <= TAKEOVER_AT_MOST_S, f"the backup took {takeover:.0f} s to take over"
    code, queue = node_run("node1", "squeue", "-h", "-o", "%i %T")
    assert code == 0 and f"{job} RUNNING" in queue, queue
    # pycli jobs: the queue through the backup; the ended jobs wait for slurmdbd, and it says so in one line.
    listed = run_pycli("jobs", str(backup), timeout=120)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert re.search(rf"^{job}\s+wrap\s+root\s+RUNNING", listed.stdout, re.M), listed.stdout
    assert "pycli: Slurm's accounting (slurmdbd, on node1) did not answer node1: the queue is current" in listed.stderr
    # The job ends under the backup, under its own id, never started again.
    for ended in (job, second):
        _wait(f"job {ended} COMPLETED", lambda ended=ended: _job_state(ended) == "COMPLETED", 120, interval_s=2)

    # The primary back: it takes over again (the backup gives it control); the job that started
    # before the backup came reports its end to the primary alone, so it ends now; the accounting
    # the backup kept reaches slurmdbd.
    code, out = node_run("node1", "systemctl", "start", "slurmdbd", "slurmctld")
    assert code == 0, out
    _wait("the primary UP again", lambda: "Slurmctld(primary) at node1 is UP" in _ping(), 60)
    code, out = node_run("node2", "systemctl", "stop", "slurmctld")  # only the primary left: it must be in control
    assert code == 0, out
    third = _sbatch_once_it_answers("node2", "the primary", 60)
    for job_id in (moved, job, second, third):
        row = sacct(job_id, wait_s=90)
        assert (row["state"], row["exit"], row["nodes"]) == ("COMPLETED", "0:0", "node2"), row
    code, runs = node_run("node1", "sacct", "-n", "-P", "-X", "-D", "-j", f"{moved},{job}", "-o", "JobID,State")
    assert code == 0 and runs.split() == [f"{moved}|COMPLETED", f"{job}|COMPLETED"], runs  # each ran once

    # Back to one controller, under a running job: the state moves back, node2's slurmctld stops for good.
    last = _running("sleep 30")
    _provision(single)
    conf = node_run("node1", "cat", "/etc/slurm/slurm.conf")[1]
    assert re.findall(r"^SlurmctldHost=(\w+)\(", conf, re.M) == ["node1"] and "SlurmctldTimeout" not in conf, conf
    assert f"\nStateSaveLocation={DEFAULT_STATE}\n" in conf, conf
    assert node_run("node2", "systemctl", "is-enabled", "slurmctld")[1].strip() == "disabled"
    assert _job_state(last) == "RUNNING"
    assert sacct(last, wait_s=90)["state"] == "COMPLETED"
