"""Slurm on the session's provisioned 2-node cluster: a second inventory of the same nodes opts in
(group slurm_controller, 4 slots a node) and `pycli provision --tags slurm` adds the scheduler.
Then `pycli train` goes through the queue: accounted, queued behind another job, cancelled by
Ctrl-C; drain and Slurm's health check keep jobs off a node; `pycli check --deep` holds the idle
node and leaves a user's job alone. Last, stand-in GPUs on both nodes: each job opens only its
own, a --docker job's containers get only its GPUs and end with it (scancel, Ctrl-C), and the
inventory's QOS and account refuse a job over them, hold it until it may run, or cancel one that
never could."""

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import docker
import pytest

from pycli.core.paths import state_dir
from pycli.local.plan import container_name
from tests.conftest import ROOT, run_pycli
from tests.integration.conftest import CLUSTER, NODE_VENV, node_run, node_shell
from tests.integration.test_cache_stage import changed_tasks, site_yml_as_typed
from tests.integration.test_train import RDZV_SOONER

pytestmark = [pytest.mark.integration, pytest.mark.lane("slurm")]  # its own lane under make test (conftest.py)
# The same figures through Slurm as started directly: the global batch (64) is shared out.
MNIST = ["--", "--epochs", "2"]
SHORT = ["--", "--width", "8", "--image-size", "32", "--num-iters", "2", "--threads", "1"]
RECORDED = ROOT / "tests" / "fixtures" / "recorded"


def sinfo() -> dict[str, tuple[str, str, str]]:
    """node -> (state, CPUs, reason), as Slurm's own sinfo says on node1."""
    code, out = node_run("node1", "sinfo", "-h", "-N", "-o", "%N|%T|%c|%E")
    assert code == 0, out
    return {n: (s, c, r) for n, s, c, r in (line.split("|", 3) for line in out.splitlines() if line.strip())}


def sacct(job_id: str, wait_s: float = 30) -> dict[str, str]:
    """The job's accounting row once it has ended, waiting up to `wait_s` for that."""
    deadline = time.monotonic() + wait_s
    while True:
        code, out = node_run("node1", "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,Start,End,NodeList")
        fields = out.strip().split("|")
        if code == 0 and len(fields) == 6 and fields[1] not in ("RUNNING", "PENDING", "COMPLETING"):
            return dict(zip(("id", "state", "exit", "start", "end", "nodes"), fields))
        assert time.monotonic() < deadline, out
        time.sleep(1)


def _sacctmgr(*args: str) -> list[str]:
    code, out = node_run("node1", "sacctmgr", "--noheader", "--parsable2", "show", *args)
    assert code == 0, out
    return [line for line in out.splitlines() if line.strip()]


def wait_for_state(node: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (found := sinfo()[node])[0] != state:
        assert time.monotonic() < deadline, f"{node} is {found}, not {state}"
        time.sleep(1)


def slurm_job_id(output: str) -> str:
    match = re.search(r"pycli: Slurm job (\d+) submitted", output)
    assert match, output[-3000:]
    return match.group(1)


def results_in(output: str) -> Path:
    line = next(line for line in output.splitlines() if "results in " in line)
    return Path(line.rsplit("results in ", 1)[1].strip())


def last_record(output: str) -> dict:
    return json.loads((results_in(output) / "metrics.jsonl").read_text().splitlines()[-1])


# What the Slurm inventory declares: one QOS of one GPU per user and
# 10 minutes a job, refusing at submission what goes over it; one of 5 minutes a job that takes
# such a job and holds it (no DenyOnLimit); a team account on both; root in it.
TEAM_QOS = {"name": "team-gpu", "max_tres_per_user": "gres/gpu=1", "max_wall": "10", "flags": ["DenyOnLimit"]}
SHORT_QOS = {"name": "team-short", "max_wall": "5"}
TEAM = {"name": "team", "fairshare": 2, "qos": ["normal", "team-gpu", "team-short"], "default_qos": "team-gpu"}
ACCOUNTING = {"slurm_qos": [TEAM_QOS, SHORT_QOS], "slurm_accounts": [TEAM],
              "slurm_users": [{"name": "root", "accounts": ["team"]}]}
REMOVED = {"slurm_qos": [{"name": "team-gpu", "state": "absent"}, {"name": "team-short", "state": "absent"}],
           "slurm_accounts": [{"name": "team", "state": "absent"}]}
DECLARED = "\n[all:vars]\n"  # the section _write_inventory adds, the inventory's last


def _write_inventory(inventory: Path, text: str, declared: dict) -> Path:
    """The inventory with `declared` in an [all:vars] section of its own: Python literals, which
    Ansible's INI inventory reads as the lists and mappings they are (a group_vars folder beside
    the file would be missed by the site run below, which reaches the file through a link)."""
    inventory.parent.mkdir(parents=True, exist_ok=True)
    inventory.write_text(text + DECLARED + "".join(f"{key}={value!r}\n" for key, value in declared.items()))
    return inventory


@pytest.fixture(scope="module")
def slurm_cluster(provisioned_cluster, tmp_path_factory):
    """The same nodes through an inventory with Slurm and ACCOUNTING; provisioned with the slurm role alone."""
    text = provisioned_cluster.read_text().replace("\nslots=1\n", "\nslots=4\n")
    assert "\nslots=4\n" in text
    inventory = _write_inventory(tmp_path_factory.mktemp("slurm") / "slurm.ini", text + "\n[slurm_controller]\nnode1\n",
                                 ACCOUNTING)
    started = time.monotonic()
    proc = run_pycli("provision", str(inventory), "--tags", "slurm", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    print(f"\nslurm role on 2 nodes: {time.monotonic() - started:.0f} s")
    return inventory


def test_provisioned_slurm_has_both_nodes_idle_and_a_second_run_changes_nothing(slurm_cluster):
    # The inventory's QOS is in the database (its accounts and users: the accounting test below), so
    # the run below changing nothing includes them.
    assert _sacctmgr("qos", "where", "name=team-gpu", "format=Name") == ["team-gpu"]
    nodes = sinfo()
    assert {n: (s, c) for n, (s, c, _) in nodes.items()} == {"node1": ("idle", "4"), "node2": ("idle", "4")}, nodes
    # The whole site, not the slurm role alone: what Slurm brings (libhwloc15 for slurmd) must not
    # trip another role's checks on the next run. Run as the README has it, without -i (pycli
    # provision passes Ansible the same ansible.cfg and no other variables).
    again = site_yml_as_typed(slurm_cluster)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    recap = again.stdout.split("PLAY RECAP")[1]
    for node in ("node1", "node2"):
        assert re.search(rf"{node}\s+: ok=\d+\s+changed=0 .*failed=0", recap), again.stdout[-6000:]


def _start(inventory: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pycli", "train", "-i", str(inventory), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _read_until(proc: subprocess.Popen, pattern: str, seen: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
    raise AssertionError(f"no line matched {pattern!r}:\n" + "".join(seen)[-3000:])


def test_mnist_goes_through_the_queue_and_waits_behind_another_job(slurm_cluster):
    first_seen: list[str] = []
    first = _start(slurm_cluster, "mnist", "--np", "8", *MNIST)
    _read_until(first, r"Slurm job \d+ RUNNING", first_seen)
    second = _start(slurm_cluster, "synthetic", "--np", "8", *SHORT)
    second_seen: list[str] = []
    _read_until(second, r"Slurm job \d+ PENDING", second_seen)
    # slurmctld restarts under them, as the role restarts it on any change of slurm.conf: both
    # jobs go on, and pycli reports both. (Here squeue waits out the restart; a squeue that
    # fails meanwhile, which pycli watches on through, is tests/unit/jobs/test_slurm.py's.)
    code, out = node_run("node1", "systemctl", "restart", "slurmctld")
    assert code == 0, out
    rest, _ = first.communicate(timeout=900)
    first_out = "".join(first_seen) + rest
    rest, _ = second.communicate(timeout=900)
    second_out = "".join(second_seen) + rest
    assert first.returncode == 0, first_out[-4000:]
    assert second.returncode == 0, second_out[-4000:]
    assert "through Slurm's queue" in first_out and "on node1, node2" in first_out
    one, two = sacct(slurm_job_id(first_out)), sacct(slurm_job_id(second_out))
    assert (one["state"], one["exit"], one["nodes"]) == ("COMPLETED", "0:0", "node[1-2]")
    assert two["state"] == "COMPLETED" and two["start"] >= one["end"], (one, two)  # never both at once
    # The same job started directly on the same nodes, as the README has it (no workload named:
    # mnist), 4 slots a node as `cluster up` gives: the same figures.
    direct = run_pycli("train", "--np", "8", "-i", str(slurm_cluster), "--scheduler", "ssh", *MNIST, timeout=900)
    assert direct.returncode == 0, direct.stdout[-3000:]
    assert "--scheduler ssh: this job bypasses Slurm's queue" in direct.stderr
    assert "Slurm job" not in direct.stdout
    assert "8 process(es) on node1, node2" in direct.stdout and "1 CPU thread(s) on rank 0" in direct.stdout, direct.stdout
    through, straight = last_record(first_out), last_record(direct.stdout)
    assert through["ranks"] == straight["ranks"] == 8
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert through[key] == pytest.approx(straight[key], rel=1e-3), key


def test_ddp_under_torchrun_and_allreduce_under_mpirun(slurm_cluster):
    ddp = run_pycli("train", "-i", str(slurm_cluster), "ddp", "--np", "8", "--", "--epochs", "1", timeout=900)
    assert ddp.returncode == 0, ddp.stdout[-4000:] + ddp.stderr[-2000:]
    assert sacct(slurm_job_id(ddp.stdout))["state"] == "COMPLETED"
    assert last_record(ddp.stdout)["ranks"] == 8
    allreduce = run_pycli("train", "-i", str(slurm_cluster), str(ROOT / "workloads" / "allreduce.py"), "--np", "8",
                          "--launcher", "mpirun", "--", "--sizes", "4K:64K", timeout=900)
    assert allreduce.returncode == 0, allreduce.stdout[-4000:] + allreduce.stderr[-2000:]
    assert sacct(slurm_job_id(allreduce.stdout))["state"] == "COMPLETED"
    # torchrun met by c10d under the Slurm job's id, read from the batch script pycli kept.
    script = (results_in(ddp.stdout).parent / "job.sbatch").read_text()
    assert 'export PET_RDZV_ID="slurm-$SLURM_JOB_ID"' in script and "--rdzv-backend c10d" in script, script


def test_srun_starts_open_mpi_ranks_through_slurms_pmi2(slurm_cluster):
    """No mpirun: Slurm starts the four ranks (PMI-2), Open MPI wires them up, Horovod's MPI
    controller sums their ranks across both nodes."""
    program = ("import torch, horovod.torch as hvd; hvd.init(); "
               "total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum); "
               "print(f'rank {hvd.rank()} of {hvd.size()} sum {int(total.item())}', flush=True)")
    code, out = node_run("node1", "srun", "--mpi=pmi2", "--nodes=2", "--ntasks-per-node=2", "--time=5",
                         f"{NODE_VENV}/bin/python", "-c", program)
    assert code == 0, out
    assert sorted(line for line in out.splitlines() if line.startswith("rank ")) == [
        f"rank {rank} of 4 sum 6" for rank in range(4)], out


def test_an_elastic_torchrun_job_goes_on_without_a_node_whose_processes_died(slurm_cluster):
    """--elastic through Slurm: node2's torchrun agent and ranks are killed; its step ends alone,
    node1's agent goes on with its own ranks, and the job ends COMPLETED. (horovodrun --elastic
    runs in the batch step as over SSH, with --no-kill: the same test passed for it, 77 s, left
    out of the suite for its time.)"""
    seen: list[str] = []
    proc = _start(slurm_cluster, "ddp", "--np", "8", "--elastic", "--min-np", "4", *RDZV_SOONER, "--",
                  "--epochs", "4", "--batch-size", "16", "--threads", "1")
    try:
        _read_until(proc, r"epoch=1 ", seen)
        code, out = node_run("node2", "pkill", "-9", "-f", "/srv/pycli/jobs/")
        assert code == 0, out
        rest, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(seen) + rest
    assert proc.returncode == 0, output[-4000:]
    assert sacct(slurm_job_id(output))["state"] == "COMPLETED"
    resumed = re.search(r"training on 4 process\(es\) via ddp \(elastic, start 2\).*, from epoch (\d)", output)
    assert resumed, output[-4000:]
    records = [json.loads(line) for line in (results_in(output) / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records][-1] == 4 and records[0]["ranks"] == 8 and records[-1]["ranks"] == 4


def _ctrl_c(inventory: Path, pattern: str, *args: str) -> tuple[str, str]:
    """`pycli train ARGS`, Ctrl-C once a line matches `pattern`: what it printed and its Slurm job
    id, once it has exited 130 with the job CANCELLED."""
    seen: list[str] = []
    proc = _start(inventory, *args)
    try:
        _read_until(proc, pattern, seen)
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=180)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-3000:]
    job_id = slurm_job_id(out)
    assert sacct(job_id)["state"].startswith("CANCELLED"), out[-3000:]
    return out, job_id


def test_ctrl_c_cancels_the_slurm_job_and_leaves_no_process(slurm_cluster):
    out, _ = _ctrl_c(slurm_cluster, r"iter 1:", "synthetic", "--np", "8", *SHORT[:-4], "--num-iters", "1000",
                     "--threads", "1")
    assert "no process of it is left on any node" in out
    for node in ("node1", "node2"):
        code, left = node_run(node, "pgrep", "-af", "/srv/pycli/jobs/")
        assert code == 1, left


def test_a_queued_job_whose_node_is_drained_ends_in_one_line_and_never_runs_later(slurm_cluster):
    # node2 is taken whole by another job, so pycli's job waits; then node2 is drained, as Slurm's
    # health check drains a sick node. The job can never start on its fixed node list: pycli cancels it.
    holder = subprocess.Popen(["docker", "exec", container_name(CLUSTER, "node1"), "srun", "--nodelist=node2",
                               "--exclusive", "--ntasks=1", "sleep", "300"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    proc = None
    try:
        _wait_running("node2")
        proc = _start(slurm_cluster, "synthetic", "--np", "8", *SHORT)
        seen: list[str] = []
        _read_until(proc, r"Slurm job \d+ PENDING", seen)
        code, said = node_run("node1", "scontrol", "update", "nodename=node2", "state=drain", "reason=gpu row remap (test)")
        assert code == 0, said
        drained = time.monotonic()
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - drained
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        holder.kill()
        node_run("node1", "scancel", "--name=sleep")
        node_run("node1", "scontrol", "update", "nodename=node2", "state=resume")
    out = "".join(seen) + rest
    job_id = slurm_job_id(out)
    assert proc.returncode == 1, out[-3000:]
    assert took < 40, (took, out[-2000:])  # docs/slurm.md: within 25 s of the drain
    assert re.search(rf"Slurm job {job_id} could not start: node2 \(drain\w*: gpu row remap \(test\)\)", out), out[-3000:]
    assert sacct(job_id)["state"].startswith("CANCELLED")
    wait_for_state("node2", "idle")
    time.sleep(3)  # node2 back: the job stays ended (sbatch --no-requeue), nothing of it in the queue
    code, queue = node_run("node1", "squeue", "-h", "-o", "%i")
    assert code == 0 and job_id not in queue.split(), queue
    assert sacct(job_id)["state"].startswith("CANCELLED")


def test_a_watch_that_loses_its_node_leaves_the_job_alone_and_attach_follows_it_to_its_results(slurm_cluster):
    proc = _start(slurm_cluster, "mnist", "--np", "8", *MNIST)
    seen: list[str] = []
    _read_until(proc, r"Slurm job \d+ RUNNING", seen)
    job_id = slurm_job_id("".join(seen))
    # node1 refuses new logins (sshd stopped; the sessions it has go on), and the watch's own
    # connection drops, as a laptop lid or a VPN switch drops it.
    code, said = node_run("node1", "systemctl", "stop", "ssh.socket", "ssh.service")
    assert code == 0, said
    try:
        subprocess.run(["pkill", "-KILL", "-f", "@@slurm gone"], check=True)  # the watch's ssh on this machine
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        node_run("node1", "systemctl", "start", "ssh.service")
    out = "".join(seen) + rest
    assert proc.returncode == 4, out[-3000:]
    assert (f"lost contact with node1; Slurm job {job_id} is still RUNNING as last seen: follow it with "
            f"'pycli jobs {slurm_cluster} --attach {job_id}'") in out, out[-3000:]
    assert "no process of it" not in out and "results in" not in out  # nothing swept, nothing fetched
    # It runs on, untouched. (Waited for at most 30 s before, and in a loaded make test an 8-rank
    # MNIST ran longer than that after its watch was lost.)
    assert sacct(job_id, wait_s=600)["state"] == "COMPLETED"
    attach = run_pycli("jobs", str(slurm_cluster), "--attach", job_id, timeout=300)
    assert attach.returncode == 0, attach.stdout[-3000:] + attach.stderr[-2000:]
    assert f"Slurm job {job_id} COMPLETED; job finished; results in " in attach.stdout, attach.stdout[-3000:]
    assert "val_accuracy" in attach.stdout  # its output, from the first line
    assert last_record(attach.stdout)["ranks"] == 8
    # A job that is not pycli's, and bad input: one line each, exit 2.
    bad = run_pycli("jobs", str(slurm_cluster), "--attach", "x1")
    assert bad.returncode == 2 and "give a Slurm job id" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_drain_keeps_jobs_off_a_node_in_slurm_too(slurm_cluster):
    drained = run_pycli("drain", "node2", "--reason", "fan noise", "-i", str(slurm_cluster))
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
        state, _, reason = sinfo()["node2"]
        assert state in ("drained", "draining") and "fan noise" in reason
        # The job names its partition and account as Slurm spells them, and sacct keeps both.
        job = run_pycli("train", "-i", str(slurm_cluster), "synthetic", "--np", "4", "--partition", "batch",
                        "--account", "team", *SHORT, timeout=900)
        assert job.returncode == 0, job.stdout[-3000:]
        job_id = slurm_job_id(job.stdout)
        assert sacct(job_id)["nodes"] == "node1"
        script = (Path(re.search(r"run folder (\S+)", job.stdout).group(1)) / "job.sbatch").read_text()
        assert "#SBATCH --partition=batch\n" in script and "#SBATCH --account=team\n" in script, script
        code, out = node_run("node1", "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "Partition,Account,QOS")
        assert code == 0 and out.strip() == "batch|team|team-gpu", out  # the account's default QOS
    finally:
        back = run_pycli("undrain", "node2", "-i", str(slurm_cluster))
    assert back.returncode == 0, back.stdout + back.stderr
    assert "Slurm: node2 RESUME (jobs start there again; drained for node2: fan noise)" in back.stdout, back.stdout
    wait_for_state("node2", "idle")
    # An administrator's drain is not pycli's to lift: shown, kept, exit 1; --force lifts it.
    code, said = node_run("node1", "scontrol", "update", "nodename=node2", "state=drain", "reason=RMA GPU3, do not resume")
    assert code == 0, said
    kept = run_pycli("undrain", "node2", "-i", str(slurm_cluster))
    assert kept.returncode == 1 and ("node2 stays drained in Slurm: its reason is not pycli's (RMA GPU3, do not resume); "
                                     "'pycli undrain node2 --force' resumes it") in kept.stdout, kept.stdout + kept.stderr
    assert "drain" in sinfo()["node2"][0]
    forced = run_pycli("undrain", "node2", "--force", "-i", str(slurm_cluster))
    assert forced.returncode == 0 and "drained for node2: RMA GPU3, do not resume" in forced.stdout, forced.stdout
    wait_for_state("node2", "idle")


def _daemon_json(node: str) -> dict:
    code, out = node_run(node, "cat", "/etc/docker/daemon.json")
    assert code == 0, out
    return json.loads(out)


class _DrainedCount:
    """The most nodes Slurm had drained at once, sampled every second while it runs."""

    def __init__(self) -> None:
        import threading

        self.most, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(1):
            code, out = node_run("node1", "sinfo", "-h", "-N", "-o", "%N|%T")
            if code == 0:
                self.most = max(self.most, sum("drain" in line for line in out.splitlines()))

    def __enter__(self) -> "_DrainedCount":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def test_a_rolling_change_takes_the_idle_node_first_and_the_busy_one_after_its_job(slurm_cluster, tmp_path):
    # A change that restarts Docker on each node (a --docker job's containers would die with it),
    # rolled one node at a time while a job runs on node1: node2 first, node1 once the job ended.
    # The job runs until the test sees the roll wait for it (at most 300 s).
    release = "/tmp/pytest-release-roll"
    node_run("node1", "rm", "-f", release)
    code, out = node_run("node1", "sbatch", "-w", "node1", "-N1", "-o", "/dev/null", "--wrap",
                         f"for i in $(seq 300); do [ -e {release} ] && exit 0; sleep 1; done")
    assert code == 0 and out.startswith("Submitted batch job "), out
    job_id = out.split()[-1]
    deadline = time.monotonic() + 60
    while _queue()[job_id][1] != "RUNNING":
        assert time.monotonic() < deadline, _queue()
        time.sleep(1)
    warn = json.dumps({"docker_daemon_options": {"log-level": "warn"}})
    roll = subprocess.Popen([sys.executable, "-m", "pycli", "provision", str(slurm_cluster), "--tags", "docker",
                             "--batch", "1", "-e", warn], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYCLI_RUNS": str(tmp_path / "runs")})
    seen: list[str] = []
    with _DrainedCount() as drained:
        _read_until(roll, r"roll: waiting for job\(s\) to end", seen, timeout=600)
        node_run("node1", "touch", release)
        rest, _ = roll.communicate(timeout=900)
    said = "".join(seen) + rest
    assert roll.returncode == 0, said[-4000:]
    assert "roll: batch 1 of 2: node2 (idle)" in said
    assert f"roll: batch 2 of 2: node1 (waits for node1: job(s) {job_id} (root))" in said
    order = ("roll: node2 gate: passed", "roll: the jobs on node1 have ended", "roll: node1 gate: passed")
    assert [said.index(line) for line in order] == sorted(said.index(line) for line in order), said[-4000:]
    assert "roll: done: 2 node(s) changed in 2 batch(es)" in said, said[-3000:]
    assert drained.most == 1  # never more than --batch nodes out of service
    code, out = node_run("node1", "sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State")
    assert code == 0 and out.split() == [f"{job_id}|COMPLETED"], out  # one run, never requeued
    assert all(_daemon_json(node).get("log-level") == "warn" for node in ("node1", "node2"))
    # Back in service when the roll ends: Slurm heard from each resumed node's slurmd (not "idle*").
    assert {node: state for node, (state, _, _) in sinfo().items()} == {"node1": "idle", "node2": "idle"}, said[-3000:]
    assert "drained:" not in run_pycli("inventory", "show", str(slurm_cluster)).stdout

    # node1's GPU turns sick: after its change it fails the node gate, stays drained with the
    # gate's reason, and the roll stops there: node2 keeps what it had.
    _stand_in("node1", "nvidia-smi", "nvidia-smi-q-a100-remap-pending.txt", "a GPU with a pending row remap")
    try:
        error = json.dumps({"docker_daemon_options": {"log-level": "error"}})
        roll = run_pycli("provision", str(slurm_cluster), "--tags", "docker", "--batch", "1", "-e", error,
                         env={"PYCLI_RUNS": str(tmp_path / "runs")}, timeout=900)
        assert roll.returncode == 1, roll.stdout[-4000:] + roll.stderr[-2000:]
        assert "roll: node1 gate: FAILED: pycli health: GPU 0" in roll.stdout, roll.stdout[-3000:]
        assert "node1 failed the gate after the change and stay(s) drained" in roll.stdout.splitlines()[-1]
        assert _daemon_json("node1").get("log-level") == "error" and _daemon_json("node2").get("log-level") == "warn"
        state, _, reason = sinfo()["node1"]
        assert "drain" in state and reason.startswith("pycli health: GPU 0") and "row remap" in reason, (state, reason)
    finally:
        node_run("node1", "rm", "-f", "/usr/local/bin/nvidia-smi")
        back = run_pycli("undrain", "node1", "-i", str(slurm_cluster))
    assert back.returncode == 0, back.stdout + back.stderr
    wait_for_state("node1", "idle")

    # Slurm itself, rolled to a version it cannot reach in place (Debian 12's 22.05 to 24.11): the
    # roll's first step, the controller's, refuses in one line; no node is drained or changed.
    before = node_run("node1", "dpkg-query", "-W", "-f", "${Version}", "slurmctld")[1]
    jump = run_pycli("provision", str(slurm_cluster), "--tags", "slurm", "--batch", "1", "-e", "slurm_version=24.11.5-1",
                     env={"PYCLI_RUNS": str(tmp_path / "runs")}, timeout=900)
    assert jump.returncode != 0, jump.stdout[-3000:]
    assert f"Slurm {before} cannot be upgraded to 24.11.5-1 in place: 24.11 reads the state of 23.02, 23.11, 24.05 only" \
        in jump.stdout, jump.stdout[-3000:]
    assert jump.stdout.strip().splitlines()[-1].endswith("the slurm role failed on the controller node1: no node was changed")
    assert node_run("node1", "dpkg-query", "-W", "-f", "${Version}", "slurmctld")[1] == before
    assert {node: state for node, (state, _, _) in sinfo().items()} == {"node1": "idle", "node2": "idle"}
    # Docker's own settings back, as the other tests know the nodes.
    back = run_pycli("provision", str(slurm_cluster), "--tags", "docker", env={"PYCLI_RUNS": str(tmp_path / "back")},
                     timeout=900)
    assert back.returncode == 0, back.stdout[-3000:]


def test_a_job_asking_for_more_gpus_than_its_nodes_have_is_refused_in_one_line(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    job = run_pycli("train", "-i", str(slurm_cluster), "synthetic", "--np", "8", "--gpus-per-node", "1", *SHORT,
                    env={"PYCLI_RUNS": str(runs)}, timeout=300)
    assert job.returncode == 2, job.stdout[-3000:] + job.stderr[-3000:]
    assert job.stderr.splitlines()[-1] == ("pycli: error: --gpus-per-node 1: more GPUs than a node of the job has "
                                           "(node1 has 0, node2 has 0, in Slurm's Gres)"), job.stderr
    assert not list(runs.glob("*/job.sbatch"))  # nothing was submitted


def _stand_in(node: str, tool: str, recorded: str, what: str) -> None:
    """/usr/local/bin/TOOL on the node: a script that prints the recorded output."""
    script = f"#!/bin/sh\n# pytest's stand-in: {what}\ncat <<'EOF'\n" + (RECORDED / recorded).read_text() + "EOF\n"
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo(tool)
        info.size, info.mode = len(script.encode()), 0o755
        tar.addfile(info, io.BytesIO(script.encode()))
    docker.from_env().containers.get(container_name(CLUSTER, node)).put_archive("/usr/local/bin", data.getvalue())


def test_slurms_health_check_drains_a_node_whose_gpu_has_a_pending_row_remap(slurm_cluster):
    stand_in = "/usr/local/bin/nvidia-smi"

    def plant() -> None:
        _stand_in("node2", "nvidia-smi", "nvidia-smi-q-a100-remap-pending.txt", "a GPU with a pending row remap")

    plant()
    try:
        interval = int(node_run("node1", "sh", "-c", "scontrol show config | awk '/^HealthCheckInterval/ {print $3}'")[1])
        deadline = time.monotonic() + interval + 60
        while True:
            state, _, reason = sinfo()["node2"]
            if "drain" in state:
                break
            assert time.monotonic() < deadline, (state, reason)
            time.sleep(2)
        assert reason.startswith("pycli health: GPU 0") and "row remap" in reason, reason
    finally:
        node_run("node2", "rm", "-f", stand_in)
    # Healthy again: the health check resumes what it drained.
    deadline = time.monotonic() + interval + 60
    while "drain" in sinfo()["node2"][0]:
        assert time.monotonic() < deadline, sinfo()["node2"]
        time.sleep(2)
    # A person's drain is theirs: a failed check keeps its reason, a passed one does not resume it.
    # (The health check run by hand, as slurmd runs it each interval.)
    drained = run_pycli("drain", "node2", "--reason", "DIMM replacement", "-i", str(slurm_cluster))
    assert drained.returncode == 0, drained.stdout + drained.stderr
    try:
        plant()
        code, said = node_run("node2", "/usr/local/sbin/pycli-slurm-health")
        assert code == 1 and "drained already: " in said and "DIMM replacement; left so" in said, said
        assert "DIMM replacement" in sinfo()["node2"][2] and "pycli health" not in sinfo()["node2"][2]
        node_run("node2", "rm", "-f", stand_in)
        code, said = node_run("node2", "/usr/local/sbin/pycli-slurm-health")
        assert code == 0, said
        state, _, reason = sinfo()["node2"]
        assert "drain" in state and "DIMM replacement" in reason and "pycli health" not in reason, (state, reason)
    finally:
        node_run("node2", "rm", "-f", stand_in)
        back = run_pycli("undrain", "node2", "-i", str(slurm_cluster))
    assert back.returncode == 0, back.stdout + back.stderr
    wait_for_state("node2", "idle")


def _queue() -> dict[str, tuple[str, str, str]]:
    """job id -> (name, state, nodes), as squeue says on node1."""
    code, out = node_run("node1", "squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%N")
    assert code == 0, out
    return {i: (j, t, n) for i, j, t, n in (line.split("|") for line in out.splitlines() if line.strip())}


def test_check_deep_holds_the_idle_node_leaves_a_users_job_alone_and_drains_the_bad_node_in_slurm(slurm_cluster, tmp_path):
    # Someone's job on node2; on node1 a GPU whose DCGM diagnostic fails (a healthy nvidia-smi, so
    # Slurm's own health check, which runs no dcgmi, passes it: only the deep check's level 1 sees it).
    code, said = node_run("node1", "sbatch", "--nodelist=node2", "--job-name=users-job", "--wrap", "sleep 600")
    assert code == 0, said
    users_job = said.split()[-1]
    waiter = ""
    try:
        _wait_running("node2")
        _stand_in("node1", "nvidia-smi", "nvidia-smi-q-h100-580.txt", "a healthy H100")
        _stand_in("node1", "dcgmi", "dcgmi-diag-4.2.3-r1-gb10.json", "a diagnostic that fails")
        check = subprocess.Popen([sys.executable, "-m", "pycli", "check", str(slurm_cluster), "--deep-only", "--fence",
                                  "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYCLI_RUNS": str(tmp_path)})
        try:
            # Once node1 is held, a job that asks for it waits for the check.
            deadline = time.monotonic() + 120
            while not any(name.startswith("pycli-check-") and state == "RUNNING" for name, state, _ in _queue().values()):
                assert check.poll() is None and time.monotonic() < deadline, _queue()
                time.sleep(0.5)
            code, said = node_run("node1", "sbatch", "--nodelist=node1", "--job-name=during-check", "--wrap", "true")
            assert code == 0, said
            waiter = said.split()[-1]
            out, err = check.communicate(timeout=600)
        finally:
            check.kill()
    finally:
        node_run("node1", "rm", "-f", "/usr/local/bin/nvidia-smi", "/usr/local/bin/dcgmi")
    assert check.returncode == 1 and "Traceback" not in err, err[-3000:]
    report = json.loads(out)
    hold = report["slurm_hold"]
    assert (hold["held"], hold["busy"]) == (["node1"], {"node2": [users_job]}), hold
    assert f"pycli: Slurm: not checked, a job runs there: node2: job {users_job}" in err, err
    gpu = next(gate for gate in report["gates"] if gate["name"] == "gpu_health")
    assert gpu["status"] == "fail" and "node1: dcgmi software Fail on GPU 0" in gpu["message"], gpu
    assert list(report["deep"]["suspects"]) == ["node1"], report["deep"]
    try:
        # Drained in Slurm with the gate's reason, before the hold let node1 go: the job that asked
        # for it meanwhile still waits; the user's job on node2 runs on, and the hold is gone.
        state, _, reason = sinfo()["node1"]
        assert "drain" in state and reason.startswith("pycli check --deep: dcgmi software Fail on GPU 0"), (state, reason)
        queue = _queue()
        assert queue[users_job][1] == "RUNNING" and queue[waiter][1] == "PENDING", queue
        assert not any(name.startswith("pycli-check-") and state not in ("CANCELLED", "COMPLETED")
                       for name, state, _ in queue.values()), queue
        assert sacct(hold["job_id"])["nodes"] == "node1"
    finally:
        node_run("node1", "scancel", users_job)
        back = run_pycli("undrain", "node1", "-i", str(slurm_cluster))
    assert back.returncode == 0, back.stdout + back.stderr
    # Undrained: the waiting job runs, after the check's hold ended.
    ran, held = sacct(waiter), sacct(hold["job_id"])
    assert ran["state"] == "COMPLETED" and ran["start"] >= held["end"], (ran, held)
    wait_for_state("node1", "idle")
    wait_for_state("node2", "idle")


def test_bench_measures_only_the_idle_node_held_and_leaves_a_users_job_alone(slurm_cluster, tmp_path):
    code, said = node_run("node1", "sbatch", "--nodelist=node2", "--job-name=users-job", "--wrap", "sleep 600")
    assert code == 0, said
    users_job = said.split()[-1]
    try:
        _wait_running("node2")
        bench = run_pycli("bench", "-i", str(slurm_cluster), "--backends", "gloo", "--launchers", "horovod",
                          "--np-list", "1", "--repeat", "1", "--no-allreduce", "--", *SHORT[1:],
                          env={"PYCLI_RUNS": str(tmp_path)}, timeout=900)
        queue = _queue()
    finally:
        node_run("node1", "scancel", users_job)
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-2000:]
    assert f"pycli: Slurm: not measured, a job runs there: node2: job {users_job}" in bench.stdout, bench.stdout[-3000:]
    held = re.search(r"pycli: Slurm: node1 held for this bench \(job (\d+), exclusive", bench.stdout)
    assert held, bench.stdout[-3000:]
    assert queue[users_job][1] == "RUNNING"  # it ran on beside the bench, untouched
    assert sacct(held.group(1))["nodes"] == "node1"  # the hold: node1 only, released when the bench ended
    (run_dir,) = tmp_path.glob("*-bench")
    assert {row["servers"] for row in csv.DictReader((run_dir / "results.csv").open()) if row["status"] == "ok"} == {"1"}
    wait_for_state("node2", "idle")


def test_secrets_stay_secret(slurm_cluster):
    keys = {}
    for node in ("node1", "node2"):
        code, modes = node_run(node, "stat", "-c", "%n %a %U:%G %s", "/etc/munge/munge.key")
        assert code == 0 and modes.strip() == "/etc/munge/munge.key 400 munge:munge 1024", (node, modes)
        keys[node] = node_run(node, "sha256sum", "/etc/munge/munge.key")[1].split()[0]
    assert keys["node1"] == keys["node2"], "every node holds the cluster's one munge key"
    # The controller's copies: a folder only its user opens, under PYCLI_STATE, never in the repository.
    secrets = state_dir() / "slurm" / CLUSTER
    modes = [oct(path.stat().st_mode & 0o777) for path in (secrets, secrets / "munge.key", secrets / "slurmdbd.password")]
    assert modes == ["0o700", "0o600", "0o600"], modes
    code, modes = node_run("node1", "stat", "-c", "%a %U", "/etc/slurm/slurmdbd.conf")
    assert code == 0 and modes.strip() == "600 slurm", modes
    code, password = node_run("node1", "sh", "-c", "sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf")
    password = password.strip()
    assert code == 0 and len(password) >= 16
    code, key = node_run("node1", "base64", "-w0", "/etc/munge/munge.key")
    assert code == 0
    # The run folders of this session's pycli (PYCLI_RUNS: its Ansible events and extra vars), and
    # the repository but for its git objects and venvs (hundreds of MB that pycli never writes).
    for folder in (Path(os.environ["PYCLI_RUNS"]), ROOT):
        found = subprocess.run(["grep", "-rlF", "--exclude-dir=.git", "--exclude-dir=.venv*", "-e", password, "-e", key[:40],
                                str(folder)], capture_output=True, text=True)
        assert found.stdout == "", f"a secret is in {found.stdout}"


def test_slurm_runs_the_node_gate_as_health_check_prolog_and_epilog(slurm_cluster):
    code, out = node_run("node2", "/usr/local/sbin/pycli-slurm-health")
    assert (code, out.strip()) == (0, "pycli health: healthy"), out
    code, config = node_run("node1", "scontrol", "show", "config")
    assert code == 0, config
    for key, program in (("HealthCheckProgram", "pycli-slurm-health"), ("Prolog", "pycli-slurm-prolog"),
                         ("Epilog", "pycli-slurm-epilog")):
        assert re.search(rf"^{key}\s+= /usr/local/sbin/{program}$", config, re.M), f"{key} is not {program}"


def _node2_in_slurm_conf() -> None:
    code, conf = node_run("node1", "cat", "/etc/slurm/slurm.conf")
    assert code == 0 and re.search(r"(?m)^NodeName=node2 ", conf), conf
    assert re.search(r"(?m)^PartitionName=\S+ Nodes=node1,node2 ", conf), conf


def test_a_moved_inventory_and_a_run_that_leaves_node2_out_keep_the_cluster_and_node2_s_job(slurm_cluster, tmp_path):
    """One run for two faults of a shared cluster. The inventory moved and renamed, written by hand
    (no local cluster's name in it): the cluster's name is the one its nodes recorded, so its
    munge key, database password and ClusterName stay. `--limit node1 --tags slurm` while a job
    runs on node2: slurm.conf keeps node2's line (a file without it restarted slurmctld without
    node2, and its job ended NODE_FAIL). So nothing changes at all, and the job completes. A run
    naming the cluster otherwise is refused in one line."""
    moved = tmp_path / "elsewhere" / "renamed.ini"
    text = slurm_cluster.read_text()
    assert "\npycli_local_cluster=" in text
    moved.parent.mkdir()
    moved.write_text("".join(line for line in text.splitlines(keepends=True) if not line.startswith("pycli_local_cluster=")))
    code, out = node_run("node1", "sbatch", "--parsable", "-w", "node2", "-J", "on-node2", "--wrap", "sleep 30")
    assert code == 0, out
    job = out.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while node_run("node1", "squeue", "-h", "-j", job, "-o", "%T")[1].strip() != "RUNNING":
        assert time.monotonic() < deadline, node_run("node1", "squeue", "-j", job)[1]
        time.sleep(1)
    runs = tmp_path / "runs"
    run = run_pycli("provision", str(moved), "--limit", "node1", "--tags", "slurm", env={"PYCLI_RUNS": str(runs)},
                    timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "note: Slurm: node2 not reached; kept in slurm.conf as it was" in run.stdout
    assert changed_tasks(runs) == [], run.stdout[-3000:]
    _node2_in_slurm_conf()
    other = run_pycli("provision", str(moved), "--limit", "node1", "--tags", "slurm", "-e", "pycli_cluster_name=another",
                      env={"PYCLI_RUNS": str(tmp_path / "refused")}, timeout=900)
    assert other.returncode != 0
    assert "These nodes were set up as cluster " in other.stdout and "this run names it another" in other.stdout, other.stdout[-3000:]
    assert sacct(job)["state"] == "COMPLETED"
    assert sinfo()["node1"][0] == "idle"


def test_a_node_lost_under_a_job_is_named_at_once_and_one_down_while_the_slurm_role_runs_stops_only_itself(
        slurm_cluster, tmp_path):
    from tests.integration.test_node_down import DEAD_NODE_ENV, _bring_back, _container, _recap

    # node2 killed one epoch into a job across both nodes (4 ranks each): horovodrun fails at once, and Slurm keeps
    # the job COMPLETING until it gives node2 up (its epilog cannot run there: minutes). pycli answers
    # when the job's processes have ended, naming node2 in its last line. Before: 472 s.
    seen: list[str] = []
    proc = _start(slurm_cluster, "mnist", "--np", "8", "--", "--epochs", "30", "--batch-size", "16")
    try:
        try:
            _read_until(proc, r"epoch=1 ", seen)
            _container("node2").kill()
            killed = time.monotonic()
            rest, _ = proc.communicate(timeout=900)
            took = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                proc.kill()
        output = "".join(seen) + rest
        last = output.strip().splitlines()[-1]
        print(f"\npycli answered {took:.0f} s after node2 was killed: {last}")
        assert proc.returncode != 0 and last.startswith("pycli: job failed") and "node2 lost (no answer over SSH" in last, \
            output[-3000:]
        assert took < 120, f"{took:.0f} s"
        # Slurm still cleans up after the job: a watch that waited for its final state would be waiting yet.
        code, state = node_run("node1", "squeue", "-h", "-t", "all", "-j", slurm_job_id(output), "-o", "%T")
        assert code == 0 and state.strip() == "COMPLETING", state

        # With node2 still down, the slurm role runs on node1 alone.
        runs = tmp_path / "runs"
        down = run_pycli("provision", str(slurm_cluster), "--tags", "slurm", env={**DEAD_NODE_ENV, "PYCLI_RUNS": str(runs)},
                        timeout=1800)
        assert down.returncode == 4, down.stdout[-3000:] + down.stderr[-2000:]
        assert _recap(runs) == {"node1": "ok", "node2": "UNREACHABLE"}
        assert "node2 unreachable" in down.stdout + down.stderr
        assert sinfo()["node1"][0] == "idle"  # the controller went on without it
        _node2_in_slurm_conf()  # and kept node2, which is down, not gone
        assert "node2" in sinfo()
    finally:
        _bring_back(slurm_cluster)
        # A person drains node2 as it comes back, and Slurm loses that DRAIN behind pycli's back
        # (a node it forgot, a state file gone): the next run through the slurm role sets it again.
        assert run_pycli("drain", "node2", "--reason", "PSU swap", "-i", str(slurm_cluster)).returncode == 0
        node_run("node1", "scontrol", "update", "nodename=node2", "state=resume")
        back = run_pycli("provision", str(slurm_cluster), "--tags", "slurm", timeout=1800)
        after = sinfo()["node2"]
        undrained = run_pycli("undrain", "node2", "-i", str(slurm_cluster))
    assert back.returncode == 0, back.stdout[-3000:]
    assert "Slurm: node2 DRAIN (pycli's drained list, set again after provisioning)" in back.stdout, back.stdout[-2000:]
    assert "drain" in after[0] and "PSU swap" in after[2], after
    assert undrained.returncode == 0, undrained.stdout + undrained.stderr
    wait_for_state("node2", "idle")
    # node2 back: the job left the queue and ran once (sbatch --no-requeue), not again unwatched.
    code, queue = node_run("node1", "squeue", "-h", "-o", "%i")
    assert code == 0 and slurm_job_id(output) not in queue.split(), queue
    code, runs = node_run("node1", "sacct", "-n", "-P", "-X", "-D", "-j", slurm_job_id(output), "-o", "JobID,State")
    assert code == 0 and len(runs.strip().splitlines()) == 1 and "REQUEUED" not in runs, runs


# Run as a job step on node2: opens each stand-in GPU and prints what the open said, then sleeps.
GPU_PROBE = ("import errno, os, sys, time\n"
             "said = []\n"
             "for n in (0, 1):\n"
             "    try:\n"
             "        os.close(os.open(f'/dev/nvidia{n}', os.O_RDWR)); said.append(f'nvidia{n}=opened')\n"
             "    except OSError as e:\n"
             "        said.append(f'nvidia{n}={errno.errorcode[e.errno]}')\n"
             "print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'), ' '.join(said), flush=True)\n"
             "time.sleep(float(sys.argv[1]))\n")


def _probe(*srun_args: str, hold_s: float = 0) -> str:
    code, said = node_run("node1", "srun", "--nodelist=node2", "--ntasks=1", *srun_args,
                          "python3", "-c", GPU_PROBE, str(hold_s))
    assert code == 0, said
    return [line for line in said.splitlines() if "nvidia0=" in line][-1]


class SharedGpus:
    """The Slurm cluster with two stand-in GPUs on each node and ACCOUNTING applied; restore() (the
    last test, else the fixture at the end) takes both away again, by provisioning."""

    def __init__(self, inventory: Path, removed: Path) -> None:
        self.inventory, self.removed = inventory, removed
        self.restored: subprocess.CompletedProcess | None = None

    def restore(self) -> subprocess.CompletedProcess:
        if self.restored is None:
            for node in ("node1", "node2"):
                node_run(node, "sh", "-c", "rm -f /dev/nvidia0 /dev/nvidia1")
            self.restored = run_pycli("provision", str(self.removed), "--tags", "slurm", timeout=1800)
        return self.restored


@pytest.fixture(scope="module")
def shared_gpus(slurm_cluster, tmp_path_factory):
    # Each node gets two stand-in GPUs (char 195:0 and 195:1, no driver): Slurm counts and gives them
    # out as it would real ones.
    text = slurm_cluster.read_text().split(DECLARED)[0]
    folder = tmp_path_factory.mktemp("shared-gpus")
    gpus = re.sub(r"^(node[12] .*)$", r"\1 slurm_standin_gpus=2", text, flags=re.M)
    shared = SharedGpus(_write_inventory(folder / "shared" / "gpus.ini", gpus, ACCOUNTING),
                        _write_inventory(folder / "removed" / "slurm.ini", text, REMOVED))
    added = run_pycli("provision", str(shared.inventory), "--tags", "slurm", timeout=1800)
    try:
        assert added.returncode == 0, added.stdout[-4000:] + added.stderr[-2000:]
        yield shared
    finally:
        shared.restore()


def test_slurm_confines_each_job_to_its_own_gpus_on_a_node_with_two_stand_in_gpus(shared_gpus):
    # The bed's nodes have their own cgroup tree (cgroup v1 hosts; see pycli/local/plan.py), so Slurm's
    # cgroup plugins run there as on a server: an open of a stand-in GPU that the job's cgroup lets
    # through fails with ENXIO (no driver answers), one it refuses with EPERM.
    if "\nslurm_cgroup=true\n" not in shared_gpus.inventory.read_text():
        pytest.skip("this host gives the node containers no cgroup v1 tree (cgroup v2): Slurm runs without its cgroup plugins")
    assert sinfo()["node2"][0] == "idle"
    code, gres = node_run("node1", "sinfo", "-h", "-N", "-n", "node2", "-o", "%G")
    assert code == 0 and gres.strip() == "gpu:2", gres
    # One GPU: its own device opens (ENXIO), the other is refused; Slurm numbers it 0 for the job.
    assert _probe("--gres=gpu:1") == "0 nvidia0=ENXIO nvidia1=EPERM"
    # No GPU: both refused.
    assert _probe() == "- nvidia0=EPERM nvidia1=EPERM"
    # Two one-GPU jobs at once, each on its own device.
    first = subprocess.Popen(
        ["docker", "exec", container_name(CLUSTER, "node1"), "srun", "--nodelist=node2", "--ntasks=1", "--gres=gpu:1",
         "python3", "-c", GPU_PROBE, "20"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_running("node2")
        second = _probe("--gres=gpu:1", "--immediate=30")
        code, running = node_run("node1", "squeue", "-h", "-t", "running", "-w", "node2", "-o", "%i")
        assert first.poll() is None and len(running.split()) >= 1, running  # the first still holds its GPU
    finally:
        out, _ = first.communicate(timeout=120)
    one = [line for line in out.splitlines() if "nvidia0=" in line][-1]
    assert {one, second} == {"0 nvidia0=ENXIO nvidia1=EPERM", "0 nvidia0=EPERM nvidia1=ENXIO"}, (one, second)
    # More GPUs than the node has: refused at once, in Slurm's one line.
    code, said = node_run("node1", "srun", "--nodelist=node2", "--gres=gpu:3", "true")
    assert code != 0 and said.strip().splitlines()[-1].endswith("Requested node configuration is not available"), said


def test_slurmd_starts_only_once_its_gpus_device_files_are_there(shared_gpus, tmp_path):
    # As after a reboot whose driver makes the device files late: slurmd waits for them (it would
    # register one GPU of two and its node would go INVAL), then starts with both. On the bed a unit
    # makes the stand-in GPUs at every boot, as a driver makes a real GPU's.
    code, out = node_shell("node2", "systemctl is-enabled pycli-standin-gpus.service && systemctl stop slurmd && "
                                    "rm /dev/nvidia1 && systemctl start --no-block slurmd && sleep 3 && "
                                    "systemctl is-active slurmd; systemctl status slurmd --no-pager -n 5")
    assert out.startswith("enabled\n") and "\nactivating\n" in out, out
    assert "waiting up to 300 s for /dev/nvidia1 before slurmd starts" in out, out
    code, out = node_shell("node2", "systemctl restart pycli-standin-gpus.service && "
                                    "for i in $(seq 30); do systemctl is-active --quiet slurmd && break; sleep 1; done; "
                                    "systemctl is-active slurmd")
    assert code == 0 and out.strip() == "active", out
    wait_for_state("node2", "idle")
    code, gres = node_run("node1", "sinfo", "-h", "-N", "-n", "node2", "-o", "%G")
    assert code == 0 and gres.strip() == "gpu:2", gres
    # The stand-in GPUs' unit and slurmd's wait, provisioned again: nothing changes.
    again = run_pycli("provision", str(shared_gpus.inventory), "--tags", "slurm", env={"PYCLI_RUNS": str(tmp_path)},
                      timeout=900)
    assert again.returncode == 0 and changed_tasks(tmp_path) == [], again.stdout[-3000:]


def _cpu_seconds(total_cpu: str) -> float:
    """sacct's TotalCPU ([DD-][HH:]MM:SS[.mmm]) in seconds."""
    days, _, rest = total_cpu.rpartition("-")
    seconds = 0.0
    for part in rest.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + (int(days) * 86400 if days else 0)


def _two_slots(inventory: Path, folder: Path) -> Path:
    """A copy of the inventory with 2 slots a node: 4 ranks are 2 on each node."""
    copy = folder / "gpus" / "two-slots.ini"
    copy.parent.mkdir()
    copy.write_text(inventory.read_text().replace("\nslots=4\n", "\nslots=2\n"))
    return copy


# Every launcher, with ranks on both nodes and two on each (a 2-slot copy of the inventory).
LAUNCHERS = {"horovodrun --gloo": ("--launcher", "horovod", "--controller", "gloo"),
             "horovodrun --mpi": ("--launcher", "horovod", "--controller", "mpi"),
             "mpirun": ("--launcher", "mpirun"), "torchrun": ("--launcher", "torchrun")}
BURN_S = 2.0  # CPU seconds each rank burns, for sacct to account


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_s_ranks_run_inside_their_slurm_job_with_its_gpus_only_and_accounted(shared_gpus, launcher,
                                                                                            tmp_path):
    # horovodrun starts the ranks of every node but its own over ssh: through Slurm its logins
    # become steps of the job (pycli.jobs.launch.slurm_ssh_script), so those ranks too get only the
    # job's GPU and its cgroups, and sacct accounts their CPU time.
    if "\nslurm_cgroup=true\n" not in shared_gpus.inventory.read_text():
        pytest.skip("this host gives the node containers no cgroup v1 tree (cgroup v2): Slurm runs without its cgroup plugins")
    inventory = _two_slots(shared_gpus.inventory, tmp_path)
    proc = run_pycli("train", "-i", str(inventory), "tests/fixtures/gpus_probe.py", "--np", "4", "--gpus-per-node", "1",
                     *LAUNCHERS[launcher], "--", "0", str(BURN_S), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    job_id = slurm_job_id(proc.stdout)
    # Every "GPUS {...}" wherever it stands: mpirun's --tag-output may put two ranks' lines on one
    # ("[1,3]<stdout>:GPUS {...}[1,2]<stdout>:GPUS {...}").
    probes = sorted((json.JSONDecoder().raw_decode(proc.stdout, found.end())[0]
                     for found in re.finditer(r"GPUS (?=\{)", proc.stdout)), key=lambda p: p["rank"])
    assert sorted((p["rank"], p["host"]) for p in probes) == [(0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")] or (
        launcher == "torchrun" and sorted(p["host"] for p in probes) == ["node1", "node1", "node2", "node2"]), probes
    for probe in probes:
        # One GPU of the node's two: its own opens (ENXIO), the other is refused, numbered 0 for the rank.
        assert sorted(probe["devices"].values()) == ["ENXIO", "EPERM"], probe
        assert probe["visible"] == "0", probe
        assert f"/job_{job_id}/step_" in probe["cgroup"], probe
    code, steps = node_run("node1", "sacct", "-n", "-P", "-j", job_id, "-o", "JobID,NodeList,TotalCPU")
    assert code == 0, steps
    on_node2 = sum(_cpu_seconds(cpu) for step, nodes, cpu in (line.split("|") for line in steps.splitlines() if line)
                   if "." in step and ("node2" in nodes or nodes == "node[1-2]"))
    assert on_node2 >= 2 * BURN_S * 0.9, steps  # node2's two ranks, accounted in the job's steps there


USER, USER_ID = "pyclitest", 2001  # a user of the team, made on both nodes by the test below


def _login(inventory_text: str, node: str, key: Path, command: str, user: str = USER, **popen) -> subprocess.Popen:
    """`ssh USER@node command` from this machine, as a user would log in, with the cluster's host keys."""
    address = re.search(rf"^{node} ansible_host=(\S+)", inventory_text, flags=re.M).group(1)
    known_hosts = inventory_text.split("UserKnownHostsFile=")[1].split("'")[0]
    return subprocess.Popen(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                             "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=20", f"{user}@{address}", command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def _logged_in(inventory_text: str, node: str, key: Path, command: str, user: str = USER) -> tuple[int, str]:
    login = _login(inventory_text, node, key, command, user)
    out, _ = login.communicate(timeout=60)
    return login.returncode, out


def test_an_ssh_login_without_a_job_is_refused_and_one_with_a_job_is_confined_to_it_and_ends_with_it(shared_gpus, tmp_path):
    # pam_slurm_adopt (slurm_ssh_adopt, on by default): a user's login lands in their job on the
    # node or is refused; root, on the inventory's allow-list, logs in as before.
    text = shared_gpus.inventory.read_text()
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    for node in ("node1", "node2"):
        code, out = node_shell(node, f"useradd -m -u {USER_ID} -s /bin/bash {USER} && install -d -m 0700 -o {USER} -g {USER} "
                                     f"/home/{USER}/.ssh && echo '{public}' > /home/{USER}/.ssh/authorized_keys && "
                                     f"chown {USER}: /home/{USER}/.ssh/authorized_keys")
        assert code == 0, out
    job_id = ""
    try:
        code, out = node_run("node1", "sacctmgr", "-i", "add", "user", USER, "account=team")
        assert code == 0, out
        # No job: refused on both nodes; root still logs in with the cluster's key.
        for node in ("node1", "node2"):
            code, out = _logged_in(text, node, key, "echo logged-in")
            assert code != 0 and "logged-in" not in out, out
        root_key = Path(text.split("ansible_ssh_private_key_file=")[1].split()[0])
        assert _logged_in(text, "node2", root_key, "echo logged-in", user="root") == (0, "logged-in\n")
        # A job of one GPU on node2: a login there lands in it; node1, where the user has none, refuses.
        code, out = node_run("node1", "runuser", "-u", USER, "--", "sbatch", "--parsable", "-w", "node2", "--gres=gpu:1",
                             "--time=5", "-D", "/tmp", "-o", "/dev/null", "--wrap", "sleep 300")
        assert code == 0, out
        job_id = out.strip().splitlines()[-1].split(";")[0]
        _wait_running("node2")
        code, out = _logged_in(text, "node2", key, f"cat /proc/self/cgroup; python3 -c {shlex.quote(GPU_PROBE)} 0")
        assert code == 0, out
        if "\nslurm_cgroup=true\n" in text:  # confined where Slurm's cgroup plugins run (cgroup v1 hosts)
            assert f"/job_{job_id}/step_extern" in out, out
            devices = re.search(r"nvidia0=(\w+) nvidia1=(\w+)", out)
            assert devices and sorted(devices.groups()) == ["ENXIO", "EPERM"], out
        code, out = _logged_in(text, "node1", key, "echo logged-in")
        assert code != 0 and "logged-in" not in out, out
        # A login still open when the job ends ends with it.
        held = _login(text, "node2", key, "echo holding; sleep 300")
        assert held.stdout.readline().strip() == "holding"
        started = time.monotonic()
        assert node_run("node1", "scancel", job_id)[0] == 0
        held.communicate(timeout=60)
        print(f"\nthe open login ended {time.monotonic() - started:.1f} s after scancel")
        ended, job_id = job_id, ""
        deadline = time.monotonic() + 60
        while node_run("node1", "squeue", "-h", "-j", ended, "-o", "%i")[1].strip() == ended:
            assert time.monotonic() < deadline, f"job {ended} still in the queue 60 s after scancel"
            time.sleep(0.5)
        code, out = _logged_in(text, "node2", key, "echo logged-in")  # the job gone, so is the way in
        assert code != 0 and "logged-in" not in out, out
    finally:
        if job_id:
            node_run("node1", "scancel", job_id)
        node_run("node1", "sacctmgr", "-i", "delete", "user", USER)
        for node in ("node1", "node2"):
            node_shell(node, f"pkill -KILL -u {USER}; userdel -r {USER}")


def _job_containers(label: str) -> dict[str, list[str]]:
    """node -> the names of the containers with `label` (key=value) on it."""
    found = {}
    for node in ("node1", "node2"):
        code, out = node_run(node, "docker", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}")
        assert code == 0, out
        found[node] = out.split()
    return found


def test_docker_jobs_run_inside_their_allocation_with_their_gpus_and_end_with_it(shared_gpus, job_image, tmp_path):
    # Slurm's own GPUs for the job: one of each node's two, as device files in its containers. Two
    # ranks a node, so that half of each node's CPUs and one GPU are left for a second job.
    inventory = _two_slots(shared_gpus.inventory, tmp_path)
    seen: list[str] = []
    proc = _start(inventory, "tests/fixtures/gpus_probe.py", "--np", "4", "--gpus-per-node", "1",
                  "--docker", job_image, "--", "600")
    try:
        while sum("GPUS " in line for line in seen) < 4:  # every rank's line
            _read_until(proc, r"GPUS ", seen)
    except BaseException:
        proc.kill()
        raise
    out = "".join(seen)
    job_id = slurm_job_id(out)
    probes = sorted((json.loads(line.split("GPUS ", 1)[1]) for line in seen if "GPUS " in line), key=lambda p: p["rank"])
    assert [(p["rank"], p["host"]) for p in probes] == [(r, "node1" if r < 2 else "node2") for r in range(4)], out[-3000:]
    assert all(len(p["devices"]) == 1 and list(p["devices"].values()) == ["ENXIO"] for p in probes), probes
    assert re.search(r"job container \S+ from \S+ up on node2 \(GPUs: --device /dev/nvidia[01]\)", out), out[-3000:]
    started = _job_containers(f"io.pycli.slurm-job={job_id}")
    assert all(len(names) == 1 for names in started.values()), started
    # A second --docker job beside it on node1 (its 2 ranks there), on the node's other GPU: its
    # container's sshd listens on a port of its own (the job's), not the first job's. Ctrl-C: pycli
    # cancels it, and when it returns no container of it is left on any node; the first job's are untouched.
    _, second = _ctrl_c(inventory, r"GPUS ", "tests/fixtures/gpus_probe.py", "--np", "2", "--gpus-per-node", "1",
                        "--docker", job_image, "--", "600")
    assert not any((left := _job_containers(f"io.pycli.slurm-job={second}")).values()), left
    assert _job_containers(f"io.pycli.slurm-job={job_id}") == started and proc.poll() is None
    # pycli is gone (a laptop closed, a killed terminal), and the job is cancelled in Slurm: the
    # epilog removes its containers on every node, and the job's private keys with them.
    proc.kill()  # its ssh children end with the job
    proc.wait(timeout=60)
    proc.stdout.close()
    code, said = node_run("node1", "scancel", job_id)
    assert code == 0, said
    deadline = time.monotonic() + 60
    while any((left := _job_containers(f"io.pycli.slurm-job={job_id}")).values()):
        assert time.monotonic() < deadline, left
        time.sleep(1)
    job_dir = re.search(r"pycli: job (\S+):", out).group(1)
    for node in ("node1", "node2"):
        code, keys = node_shell(node, f"ls /srv/pycli/jobs/{job_dir}/container")
        assert code == 0 and sorted(keys.split()) == ["authorized_keys", "entry.sh", "known_hosts", "run-options",
                                                      "start.sh"], (node, keys)
    code, steps = node_run("node1", "sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,NodeList")
    assert code == 0, steps
    # The job, its batch step, and the step that started the containers on both nodes.
    rows = {line.split("|")[0]: line.split("|")[1:] for line in steps.splitlines() if line.strip()}
    assert rows[job_id][0].startswith("CANCELLED") and rows[job_id][1] == "node[1-2]", steps
    assert rows[f"{job_id}.0"] == ["COMPLETED", "node[1-2]"], steps


def _wait_running(node: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, running = node_run("node1", "squeue", "-h", "-t", "running", "-w", node, "-o", "%i")
        if code == 0 and running.split():
            return
        time.sleep(0.5)
    raise AssertionError(f"no job started running on {node} within {timeout:.0f} s")


def test_accounts_and_a_qos_from_the_inventory_hold_or_refuse_a_job_over_its_limit_in_one_line(shared_gpus):
    # Applied by the slurm_cluster fixture; the first test's second run of the site changed nothing.
    assert _sacctmgr("qos", "where", "name=team-gpu", "format=Name,MaxTRESPU,MaxWall,Flags") == [
        "team-gpu|gres/gpu=1|00:10:00|DenyOnLimit"]
    assert _sacctmgr("association", "where", "account=team", "format=Account,User,Fairshare,QOS,DefaultQOS") == [
        "team||2|normal,team-gpu,team-short|team-gpu", "team|root|1|normal,team-gpu,team-short|team-gpu"]
    queue = ["--account", "team", "--qos", "team-gpu", "--gpus-per-node", "1"]
    # Two GPUs (one on each node) where the QOS allows one a user: sbatch refuses it, in Slurm's words.
    over = run_pycli("train", "-i", str(shared_gpus.inventory), "synthetic", "--np", "8", *queue, *SHORT, timeout=300)
    assert over.returncode == 1, over.stdout[-3000:] + over.stderr[-3000:]
    assert over.stderr.splitlines()[-1] == (
        "pycli: error: sbatch on node1 refused the job: QOSMaxGRESPerUser: Batch job submission failed: Job violates "
        "accounting/QOS policy (job submit limit, user's size and/or time limits)"), over.stderr
    # Longer than its QOS's 10 minutes, and an account the user is not in: Slurm refuses both at once
    # (sbatch itself: pycli says sbatch's lines as above, and staging the job twice more costs 20 s).
    code, said = node_run("node1", "sbatch", "--account=team", "--qos=team-gpu", "--time=60", "--wrap", "true")
    assert code != 0 and "sbatch: error: QOSMaxWallDurationPerJobLimit" in said, said
    code, said = node_run("node1", "sbatch", "--account=nosuch", "--wrap", "true")
    assert code != 0 and said.strip().endswith("Invalid account or account/partition combination specified"), said
    # One GPU while another job of the user's holds the one the QOS allows: held with Slurm's reason, then run.
    holder = subprocess.Popen(
        ["docker", "exec", container_name(CLUSTER, "node1"), "srun", "--nodelist=node2", "--account=team", "--qos=team-gpu",
         "--gres=gpu:1", "sleep", "15"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_running("node2")
        held = run_pycli("train", "-i", str(shared_gpus.inventory), "synthetic", "--np", "4", *queue, *SHORT, timeout=600)
    finally:
        holder.communicate(timeout=120)
    assert held.returncode == 0, held.stdout[-3000:] + held.stderr[-2000:]
    job_id = slurm_job_id(held.stdout)
    assert f"pycli: Slurm job {job_id} PENDING (QOSMaxGRESPerUser; held by a limit of its QOS or account)" in held.stdout
    code, out = node_run("node1", "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "Account,QOS,State,AllocTRES")
    assert code == 0 and out.startswith("team|team-gpu|COMPLETED|") and "gres/gpu=1" in out, out
    # Over the per-job wall time of a QOS that takes such a job: it would wait for ever, so pycli
    # cancels it at once, in one line with Slurm's reason.
    never = run_pycli("train", "-i", str(shared_gpus.inventory), "synthetic", "--np", "2", "--account", "team", "--qos",
                      "team-short", "--time-limit", "600", *SHORT, timeout=300)
    assert never.returncode == 1, never.stdout[-3000:] + never.stderr[-2000:]
    job_id = slurm_job_id(never.stdout)
    assert (f"Slurm job {job_id} would never start as asked (QOSMaxWallDurationPerJobLimit: over a per-job limit of its "
            "QOS, account or partition), so pycli cancelled it") in never.stdout, never.stdout[-3000:]
    assert sacct(job_id)["state"].startswith("CANCELLED")
    # What says absent is removed (root's own account, and root, stay); the stand-ins go with the nodes' files.
    back = shared_gpus.restore()
    assert back.returncode == 0, back.stdout[-3000:]
    assert _sacctmgr("qos", "where", "name=team-gpu,team-short", "format=Name") == []
    assert _sacctmgr("association", "where", "user=root", "format=Account,User") == ["root|root"]
    code, gres = node_run("node1", "sinfo", "-h", "-N", "-n", "node2", "-o", "%G")
    assert gres.strip() == "(null)", gres
    # Nothing declared present: enforcement is off again, and any account name runs as before.
    conf = node_run("node1", "cat", "/etc/slurm/slurm.conf")[1]
    assert "AccountingStorageEnforce" not in conf, conf
