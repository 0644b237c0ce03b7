"""pycli.jobs.slurm: the scheduler choice, the batch script and Slurm's answers as pycli reads them."""

from __future__ import annotations

import subprocess
import time

import pytest

from pycli.core.errors import BadInput
from pycli.cluster import slurm_nodes
from pycli.jobs import slurm


def test_the_default_is_slurm_where_the_inventory_has_it():
    assert slurm.choose_scheduler(None, True) == "slurm"
    assert slurm.choose_scheduler(None, False) == "ssh"
    assert slurm.choose_scheduler("ssh", True) == "ssh"


@pytest.mark.parametrize("asked, has, fragment", [
    ("pbs", True, "unknown --scheduler 'pbs'; use one of slurm, ssh"),
    ("slurm", False, "this inventory has no Slurm; add a [slurm_controller] group"),
])
def test_bad_schedulers_are_one_line(asked, has, fragment):
    with pytest.raises(BadInput) as caught:
        slurm.choose_scheduler(asked, has)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("seconds, text", [(30, "0:00:30"), (59.2, "0:01:00"), (3661, "1:01:01"), (0.1, "0:00:01")])
def test_time_limit(seconds, text):
    assert slurm.time_limit(seconds) == text


def _job(**changes) -> slurm.BatchJob:
    values = dict(name="pycli-mnist", nodes=("node1", "node2"), tasks_per_node=4, workdir="/srv/pycli/jobs/j1",
                  output="/srv/pycli/jobs/j1/slurm-%j.out", steps=(("node1", "cd /srv/pycli/jobs/j1 && horovodrun -np 8"),),
                  time_limit_s=90, comment="pycli job j1")
    values.update(changes)
    return slurm.BatchJob(**values)


def test_the_script_asks_for_the_plans_nodes_and_runs_its_line():
    script = slurm.sbatch_script(_job())
    assert script.startswith("#!/bin/bash\n")
    for line in ["#SBATCH --job-name=pycli-mnist", "#SBATCH --nodes=2", "#SBATCH --nodelist=node1,node2",
                 "#SBATCH --ntasks-per-node=4", "#SBATCH --chdir=/srv/pycli/jobs/j1",
                 "#SBATCH --output=/srv/pycli/jobs/j1/slurm-%j.out", "#SBATCH --time=0:01:30",
                 "#SBATCH '--comment=pycli job j1'", "cd /srv/pycli/jobs/j1 && horovodrun -np 8"]:
        assert line + "\n" in script
    assert "--gres" not in script and "srun" not in script
    assert "--gres=gpu:4" in slurm.sbatch_script(_job(gpus_per_node=4))


def test_one_launcher_per_node_runs_its_nodes_line_under_srun(tmp_path):
    steps = (("node1", "echo first 'quoted'"), ("node2", "echo second"))
    script = slurm.sbatch_script(_job(steps=steps))
    srun_line = script[script.index("\nsrun ") + 1:].rstrip("\n")
    assert srun_line.startswith('srun --ntasks-per-node=1 --ntasks=2 --cpus-per-task="$SLURM_CPUS_ON_NODE" --cpu-bind=none '
                                '--kill-on-bad-exit=1 bash -c ')
    # What each node's task runs: its own line, chosen by the name slurmd gives it.
    inner = srun_line.split(" bash -c ", 1)[1]
    for node, said in [("node1", "first quoted"), ("node2", "second"), ("node3", "")]:
        ran = subprocess.run(["bash", "-c", f"bash -c {inner}"], env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True)
        assert ran.stdout.strip() == said
        assert ran.returncode == (2 if node == "node3" else 0)


def test_a_setup_step_runs_first_on_every_node_and_its_failure_ends_the_job(tmp_path):
    """--docker: the containers start as the job's first step, one task a node; a node where
    one does not start ends the job with that step's code, before the launcher runs."""
    script = slurm.sbatch_script(_job(setup="echo up on $SLURMD_NODENAME"))
    setup = next(line for line in script.splitlines() if line.startswith("srun "))
    assert setup.startswith("srun --ntasks-per-node=1 --ntasks=2 --kill-on-bad-exit=1 bash -c ")
    assert script.index(setup) < script.index("horovodrun")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ "$1" != bash ]; do shift; done\n'
                                  'SLURMD_NODENAME=node2 "$@" || exit $?\n')
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "horovodrun").write_text("#!/bin/sh\necho launcher\n")
    (bin_dir / "horovodrun").chmod(0o755)
    for setup_line, code, said in [("echo up on $SLURMD_NODENAME", 0, ["up on node2", "launcher"]),
                                   ("echo refused; exit 4", 4, ["refused"])]:
        (tmp_path / "job.sbatch").write_text(slurm.sbatch_script(_job(setup=setup_line, steps=(("node1", "horovodrun"),))))
        ran = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=60)
        assert (ran.returncode, ran.stdout.splitlines()) == (code, said), ran


def test_the_script_hands_its_steps_the_slurm_job_id_when_asked(tmp_path):
    script = slurm.sbatch_script(_job(job_id_env="PET_RDZV_ID", steps=(("node1", "echo $PET_RDZV_ID"), ("node2", "true"))))
    export = next(line for line in script.splitlines() if line.startswith("export "))
    ran = subprocess.run(["bash", "-c", f"{export}; echo $PET_RDZV_ID"], env={"SLURM_JOB_ID": "77", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "slurm-77"
    assert script.index(export) < script.index("\nsrun ")
    assert "export " not in slurm.sbatch_script(_job())


def test_each_job_meets_on_a_port_of_its_own_picked_as_it_starts_not_when_it_was_staged():
    """torchrun's rendezvous endpoint: the address given, the port from the Slurm job id, in a range
    below the kernel's ephemeral ports; two jobs queued at once, which staging gave the same free
    port, get two."""
    script = slurm.sbatch_script(_job(rendezvous_env=("PET_RDZV_ENDPOINT", "10.0.0.1"),
                                      steps=(("node1", "true"), ("node2", "true"))))
    (export,) = [line for line in script.splitlines() if line.startswith("export PET_RDZV_ENDPOINT=")]
    ports = set()
    for job_id in (41, 42, 5041):
        ran = subprocess.run(["bash", "-c", f"{export}; echo $PET_RDZV_ENDPOINT"], capture_output=True, text=True,
                             env={"SLURM_JOB_ID": str(job_id), "PATH": "/usr/bin:/bin"}, check=True)
        address, port = ran.stdout.strip().rsplit(":", 1)
        assert address == "10.0.0.1" and 20000 <= int(port) < 25000 < 32768, ran.stdout
        ports.add(int(port))
    assert ports == {20041, 20042}  # 41 and 5041: the range's length apart


def test_elastic_keeps_the_allocation_and_ends_as_the_first_node_s_launcher(tmp_path):
    """--elastic: --no-kill, a step per node that may fail alone, the first node's exit is the job's."""
    steps = (("node1", "echo first; exit 3"), ("node2", "echo second; exit 9"))
    script = slurm.sbatch_script(_job(steps=steps, elastic=True))
    assert "#SBATCH --no-kill\n" in script
    srun_lines = [line for line in script.splitlines() if line.startswith("srun ")]
    assert [line.endswith(" &") for line in srun_lines] == [True, False]  # node2 in the background, node1 waited for
    for line, node in zip(srun_lines, ("node2", "node1")):
        assert f"--nodes=1 --ntasks=1 " in line and f"--nodelist={node} " in line
        assert "--no-kill --kill-on-bad-exit=0" in line and '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in line
    # Run as Slurm would, srun standing in for itself: the script exits with node1's code.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ "$1" != bash ]; do shift; done; exec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    ran = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_CPUS_ON_NODE": "4"},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 3 and sorted(ran.stdout.split()) == ["first", "second"], ran
    assert "--no-kill" not in slurm.sbatch_script(_job(steps=steps))


def test_job_id_from_sbatch_parsable():
    assert slurm.parse_job_id("42\n") == "42"
    assert slurm.parse_job_id("43;cluster_a\n") == "43"
    with pytest.raises(ValueError):
        slurm.parse_job_id("sbatch: error: Batch job submission failed\n")


def test_watch_lines():
    assert slurm.parse_watch_line("@@slurm PENDING|Resources|n/a|") == slurm.QueueState("PENDING", "Resources", "", "")
    assert slurm.parse_watch_line("@@slurm RUNNING|None|node1|node[1-2]") == slurm.QueueState(
        "RUNNING", "None", "node1", "node[1-2]")
    assert slurm.parse_watch_line("@@slurm gone") is None
    assert slurm.parse_watch_line("epoch 1 loss 0.3") is None


SACCT = """\
2|root|COMPLETED|0:0|2026-11-26T12:40:01|2026-11-26T12:40:01|00:00:41|node[1-2]|None|pycli-mnist
3|root|CANCELLED by 0|0:0|2026-11-26T12:41:00|2026-11-26T12:41:02|00:00:09|node[1-2]|None|pycli-mnist
4|alice|FAILED|1:0|2026-11-26T12:42:00|2026-11-26T12:42:01|00:00:05|node1|NonZeroExitCode|pycli-ddp
5|root|PENDING|0:0|2026-11-26T12:43:00|Unknown|00:00:00|None assigned|Resources|hostname
6|eve|RUNNING|0:0|2026-11-26T12:44:00|2026-11-26T12:44:01|00:00:03|node2|None|a|b\x1b[2Jc
"""


def test_sacct_lines():
    jobs = slurm.parse_sacct(SACCT)
    assert [(j.job_id, j.state, j.exit_code, j.finished) for j in jobs] == [
        ("2", "COMPLETED", 0, True), ("3", "CANCELLED", 0, True), ("4", "FAILED", 1, True), ("5", "PENDING", 0, False),
        ("6", "RUNNING", 0, False)]
    assert jobs[2].user == "alice" and jobs[2].nodes == "node1" and jobs[0].elapsed == "00:00:41"
    # A "|" in a name is part of it, and an escape sequence never reaches the terminal.
    assert (jobs[4].job_id, jobs[4].name, jobs[4].state) == ("6", "a|b?[2Jc", "RUNNING")
    assert slurm.parse_sacct("garbage\n|||\n") == []


def test_sacct_command_quotes_what_it_is_given():
    assert slurm.sacct_command(["7"]) == "sacct -X -n -P -o " + ",".join(slurm.SACCT_FIELDS) + " -j 7 -a"
    assert "-S 'now-1days; rm -rf /'" in slurm.sacct_command(since="now-1days; rm -rf /")


def test_sinfo_nodes_and_what_a_job_can_start_on():
    nodes = slurm_nodes.parse_sinfo_nodes("node1|idle|gpu:8(S:0-1)|none\nnode2|drained|(null)|pycli: ecc errors|x\n"
                                    "node3|down*|gpu:h100:4|Not responding\nnode4|mixed|(null)|none\nnode1|idle|gpu:8|none\n")
    assert [(n.node, n.gpus, n.available) for n in nodes.values()] == [
        ("node1", 8, True), ("node2", 0, False), ("node3", 4, False), ("node4", 0, True)]
    assert nodes["node2"].reason == "pycli: ecc errors|x"
    assert [n.node for n in slurm_nodes.unavailable(nodes, ["node4", "node3", "node2", "node9"])] == ["node3", "node2"]


def test_drain_and_resume_commands_quote_the_reason():
    assert slurm_nodes.drain_command(["node2"], "gpu: Xid 79; it's gone") == (
        "scontrol update nodename=node2 state=drain reason='gpu: Xid 79; it'\"'\"'s gone'")
    assert slurm_nodes.resume_command(["node1", "node2"]) == "scontrol update nodename=node1,node2 state=resume"


def _fake_squeue(tmp_path, monkeypatch, answers: list[tuple[int, str]]):
    """`squeue` that gives `answers` in turn (exit code, what it prints), the last one again after."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for i, (code, text) in enumerate(answers):
        (bin_dir / f"answer{i}").write_text(f"{code}\n{text}")
    (bin_dir / "squeue").write_text(
        '#!/bin/bash\nd=$(dirname "$0"); n=$(cat "$d/n" 2>/dev/null || echo 0); f="$d/answer$n"\n'
        f'[ -f "$f" ] || f="$d/answer{len(answers) - 1}"; echo $((n + 1)) > "$d/n"\n'
        'code=$(head -n 1 "$f"); text=$(tail -n +2 "$f")\n'
        '[ "$code" = 0 ] && { [ -n "$text" ] && echo "$text"; exit 0; }; echo "$text" >&2; exit "$code"\n')
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return bin_dir / "n"


DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def test_the_watch_goes_on_while_slurmctld_does_not_answer_and_ends_on_the_final_state(tmp_path, monkeypatch):
    """slurmctld restarting under a running job (the role restarts it on every slurm.conf change)."""
    asked = _fake_squeue(tmp_path, monkeypatch, [
        (0, "RUNNING|None|node1|node[1-2]"), (1, DOWN), (1, DOWN), (0, "RUNNING|None|node1|node[1-2]"),
        (0, "COMPLETED|None|node1|node[1-2]"), (0, "")])
    ran = subprocess.run(["bash", "-c", slurm.watch_command("42", interval_s=0.01)], capture_output=True, text=True,
                         timeout=60)
    lines = ran.stdout.splitlines()
    assert lines == ["@@slurm RUNNING|None|node1|node[1-2]", f"@@slurm-unanswered {DOWN}",
                     "@@slurm RUNNING|None|node1|node[1-2]", "@@slurm COMPLETED|None|node1|node[1-2]", "@@slurm gone"]
    assert asked.read_text().strip() == "5"  # ended on COMPLETED, not on the failed squeue
    assert slurm.unanswered(lines[1]) == DOWN and slurm.parse_watch_line(lines[1]) is None
    assert slurm.unanswered(lines[0]) is None


def test_the_watch_ends_once_the_job_s_processes_have_and_slurm_only_cleans_up(tmp_path, monkeypatch):
    """A node lost under the job: Slurm waits minutes for its epilog (COMPLETING); the job's end is known."""
    asked = _fake_squeue(tmp_path, monkeypatch, [
        (0, "RUNNING|None|node1|node[1-2]"), (0, "COMPLETING|NonZeroExitCode|node1|node2"),
        (0, "COMPLETING|NonZeroExitCode|node1|node2"), (0, "FAILED|NonZeroExitCode|node1|node[1-2]")])
    ran = subprocess.run(["bash", "-c", slurm.watch_command("42", interval_s=0.01)], capture_output=True, text=True,
                         timeout=60)
    lines = ran.stdout.splitlines()
    assert lines == ["@@slurm RUNNING|None|node1|node[1-2]", "@@slurm COMPLETING|NonZeroExitCode|node1|node2",
                     "@@slurm gone"]
    assert asked.read_text().strip() == "2"
    assert slurm.parse_watch_line(lines[1]) == slurm.QueueState("COMPLETING", "NonZeroExitCode", "node1", "node2")


@pytest.mark.parametrize("last", [(0, ""), (1, "slurm_load_jobs error: Invalid job id specified")])
def test_the_watch_ends_when_slurm_answers_it_no_longer_has_the_job(tmp_path, monkeypatch, last):
    _fake_squeue(tmp_path, monkeypatch, [(0, "RUNNING|None|node1|node1"), (1, DOWN), last])
    ran = subprocess.run(["bash", "-c", slurm.watch_command("42", interval_s=0.01)], capture_output=True, text=True,
                         timeout=60)
    assert ran.stdout.splitlines()[-1] == "@@slurm gone" and ran.stdout.count("@@slurm-unanswered") == 1


def test_the_job_s_output_is_followed_through_a_moment_without_slurmctld(tmp_path, monkeypatch):
    asked = _fake_squeue(tmp_path, monkeypatch, [(0, "RUNNING"), (1, DOWN), (1, DOWN), (0, "RUNNING"), (0, "")])
    out = tmp_path / "slurm-42.out"
    out.write_text("epoch 1\n")
    ran = subprocess.run(["bash", "-c", slurm.output_command(str(out), "42", interval_s=0.01)], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0 and "epoch 1" in ran.stdout
    assert asked.read_text().strip() == "5"


def test_slurmctld_s_own_record_of_a_job_in_sacct_s_terms():
    line = ("JobId=42 JobName=pycli-mnist UserId=root(0) GroupId=root(0) JobState=COMPLETED Reason=None "
            "Dependency=(null) ExitCode=0:0 RunTime=00:00:31 SubmitTime=2026-11-28T18:00:00 "
            "StartTime=2026-11-28T18:00:01 NodeList=node[1-2] BatchHost=node1")
    job = slurm.parse_scontrol_job(line + "\n", "42")
    assert job is not None and job.finished and (job.state, job.exit_code, job.signal, job.nodes, job.user) == (
        "COMPLETED", 0, 0, "node[1-2]", "root")
    failed = slurm.parse_scontrol_job(line.replace("COMPLETED", "FAILED").replace("ExitCode=0:0", "ExitCode=3:0"), "42")
    assert failed is not None and (failed.state, failed.exit_code) == ("FAILED", 3)
    assert slurm.parse_scontrol_job(line, "43") is None
    # Its processes ended, Slurm's clean-up not yet: what sacct will say, by the exit code.
    completing = line.replace("JobState=COMPLETED", "JobState=COMPLETING")
    assert slurm.parse_scontrol_job(completing.replace("ExitCode=0:0", "ExitCode=1:0"), "42").state == "FAILED"
    assert slurm.parse_scontrol_job(completing.replace("ExitCode=0:0", "ExitCode=0:9"), "42").state == "FAILED"
    assert slurm.parse_scontrol_job(completing, "42").state == "COMPLETED"
    assert slurm.parse_scontrol_job("slurm_load_jobs error: Invalid job id specified", "42") is None


def test_a_completed_job_is_a_success_while_slurmdbd_is_down(monkeypatch):
    """sacct has no record (slurmdbd down): slurmctld's own record says how the job ended."""
    from types import SimpleNamespace

    from pycli.cluster.model import Host
    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import slurm_queue as slurm_jobs

    asked = []

    def ssh_each(commands, shared=False):
        ((host, command),) = commands
        asked.append(command.split()[0])
        if command.startswith("sacct"):
            return {host.name: NodeOutput(host.name, 1, stderr="sacct: error: Problem talking to the database")}
        return {host.name: NodeOutput(host.name, 0, "JobId=42 JobName=pycli-mnist JobState=COMPLETED ExitCode=0:0\n")}

    monkeypatch.setattr(slurm_jobs, "ssh_each", ssh_each)
    plan = SimpleNamespace(rank0=Host("node1", "10.0.0.1"))
    job = slurm_jobs.accounted(plan.rank0, "42")
    assert job is not None and job.state == "COMPLETED" and asked == ["sacct", "scontrol"]
    assert slurm_jobs.ending(job, "42", interrupted=False, time_limit_s=None).code == 0


def test_ctrl_c_while_sbatch_submits_cancels_the_job_once_its_id_is_known(monkeypatch, tmp_path):
    """The SIGINT handler is in place before sbatch (and sbatch's ssh is out of the terminal's
    reach): the job is never left in the queue unknown to pycli."""
    import os
    import signal
    from pathlib import PurePosixPath

    from pycli.cluster.model import Cluster, Host
    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import slurm_queue as slurm_jobs
    from pycli.jobs import slurm_watch, train
    from pycli.jobs.launch import NodeLayout

    hosts = (Host("node1", "10.0.0.1", user="root"), Host("node2", "10.0.0.2", user="root"))
    cluster = Cluster(hosts=hosts, launcher="node1", inventory=tmp_path / "inventory.ini")
    request = train.JobRequest.of(np=2, workload="synthetic", scheduler="ssh",
                               env=("http_proxy=http://alice:s3cret@proxy.example:3128",))
    plan = train.plan_job(cluster, request, layout=NodeLayout(work_dir=PurePosixPath("/srv/pycli")), job_id="j1")
    asked: list[str] = []

    def submit(plan, script):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while sbatch runs
        return "42"

    class Watch:
        def __init__(self, host, command, prefix, write):
            self.write = write

        def wait(self, timeout):
            if "scancel 42" not in asked:
                raise subprocess.TimeoutExpired("watch", timeout)
            self.write("@@slurm gone")  # Slurm's word that the job left the queue

        def kill(self):
            pass

    def ssh_each(commands, shared=False):
        asked.extend(command for _, command in commands)
        return {host.name: NodeOutput(host.name, 0) for host, _ in commands}

    monkeypatch.setattr(slurm_jobs, "submit", submit)
    monkeypatch.setattr(slurm_watch, "RemoteProcess", Watch)
    monkeypatch.setattr(slurm_watch, "ssh_each", ssh_each)
    monkeypatch.setattr(slurm_jobs, "accounted", lambda plan, job_id: slurm.AccountedJob(
        job_id, "pycli-synthetic", "root", "CANCELLED", 0, 15, "", "", "", "node[1-2]", ""))
    said: list[str] = []
    ended, job_id = slurm_jobs.run_slurm(plan, {}, tmp_path, said.append)
    assert job_id == "42" and asked[0] == "scancel 42"
    assert ended.code == 130 and "pycli: cancelling Slurm job 42 (scancel)" in said
    record = (tmp_path / "job.sbatch").read_text()
    assert "s3cret" not in record and "proxy.example:3128" in record  # masked as job.txt masks it


def test_sbatchs_refusal_is_one_line_with_slurms_own_reason_first():
    # Slurm 22.05's sbatch over a QOS with DenyOnLimit: the reason, then the general line.
    over = ("sbatch: error: QOSMaxGRESPerUser\n"
            "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
            "size and/or time limits)\n")
    assert slurm.submit_refusal(over) == ("QOSMaxGRESPerUser: Batch job submission failed: Job violates accounting/QOS "
                                          "policy (job submit limit, user's size and/or time limits)")
    assert slurm.submit_refusal("sbatch: error: Batch job submission failed: Invalid account or account/partition "
                                "combination specified\n") == (
        "Batch job submission failed: Invalid account or account/partition combination specified")
    assert slurm.submit_refusal("ssh: connect to host node1 port 22: Connection refused\n") == ""


@pytest.mark.parametrize(("reason", "limit", "for_good"), [
    ("QOSMaxGRESPerUser", True, False),  # the user's other jobs end, and it starts
    ("AssocGrpGRES", True, False),
    ("QOSMaxWallDurationPerJobLimit", True, True),  # it alone is over: it never starts
    ("AssocMaxNodesPerJobLimit", True, True),
    ("PartitionTimeLimit", False, True),
    ("Resources", False, False),
    ("Priority", False, False),
    ("QOSNotAllowed", False, False),
])
def test_which_pending_reasons_are_limits_and_which_hold_a_job_for_good(reason, limit, for_good):
    assert (slurm.held_by_limit(reason), slurm.never_starts(reason)) == (limit, for_good)


def test_a_job_held_for_good_ends_as_bad_input_with_its_reason():
    from pycli.core.errors import EXIT_BAD_INPUT
    from pycli.jobs import slurm_queue as slurm_jobs

    cancelled = slurm.AccountedJob(job_id="42", user="root", state="CANCELLED", exit_code=0, signal=0, submit="", start="",
                                   elapsed="", nodes="", reason="", name="pycli-mnist")
    held = slurm.held_for_good("QOSMaxWallDurationPerJobLimit")
    ended = slurm_jobs.ending(cancelled, "42", interrupted=False, time_limit_s=None, held=held)
    assert ended.code == EXIT_BAD_INPUT
    assert ended.why == ("Slurm job 42 would never start as asked (QOSMaxWallDurationPerJobLimit: over a per-job limit of "
                         "its QOS, account or partition), so pycli cancelled it")


def test_the_script_asks_slurm_never_to_requeue_the_job():
    # pycli owns the restarts: a lost node or a prolog that drained one must not rerun the job unwatched.
    assert "#SBATCH --no-requeue" in slurm.sbatch_script(_job()).splitlines()


@pytest.mark.parametrize(("reason", "held"), [
    ("launch failed requeued held", True), ("launch_failed_requeued_held", True), ("JobHeldUser", False),
    ("Resources", False), ("ReqNodeNotAvail, UnavailableNodes:node2", False)])
def test_a_job_requeued_held_is_one_that_waits_for_good(reason, held):
    assert slurm.requeued_held(reason) is held


def test_attach_reads_the_job_s_folder_and_nodes_from_sacct():
    assert slurm.attach_command("42") == "sacct -X -n -P -a -j 42 -o JobID,State,NodeList,WorkDir"
    said = "41|COMPLETED|node1|/srv/pycli/jobs/a\n42|RUNNING|node[1-2]|/srv/pycli/jobs/20261206-x\n"
    assert slurm.parse_attach(said, "42") == {"JobID": "42", "State": "RUNNING", "NodeList": "node[1-2]",
                                              "WorkDir": "/srv/pycli/jobs/20261206-x"}
    assert slurm.parse_attach(said, "43") is None
    assert slurm.parse_attach("44|RUNNING|node1|\n", "44") is None  # slurmdbd has not heard of its folder yet
    own = ("JobId=44 JobName=pycli-mnist UserId=root(0) JobState=RUNNING Reason=None NodeList=node[1-2] "
           "BatchHost=node1 WorkDir=/srv/pycli/jobs/20261206-y StdOut=/srv/pycli/jobs/20261206-y/slurm-44.out")
    assert slurm.parse_attach_scontrol(own, "44") == {"JobID": "44", "State": "RUNNING", "NodeList": "node[1-2]",
                                                      "WorkDir": "/srv/pycli/jobs/20261206-y"}
    assert slurm.parse_attach_scontrol(own, "4") is None


def test_the_output_goes_on_from_the_line_a_dropped_connection_left_it_at(tmp_path, monkeypatch):
    _fake_squeue(tmp_path, monkeypatch, [(0, "RUNNING"), (0, "")])
    out = tmp_path / "slurm-42.out"
    out.write_text("epoch 1\nepoch 2\nepoch 3\n")
    ran = subprocess.run(["bash", "-c", slurm.output_command(str(out), "42", interval_s=0.01, from_line=3)],
                         capture_output=True, text=True, timeout=60)
    assert ran.stdout.splitlines() == ["epoch 3"]


def _fake_slurm(tmp_path, monkeypatch, script: str) -> Path:
    """squeue, sinfo and scancel as one script `slurm` of the test's (its first word: which one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "slurm").write_text("#!/bin/bash\nd=$(dirname \"$0\")\n" + script)
    for tool in ("squeue", "sinfo", "scancel"):
        (bin_dir / tool).write_text(f'#!/bin/bash\nexec "$(dirname "$0")/slurm" {tool} "$@"\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return bin_dir


def _watch(monkeypatch, **kw):
    import threading
    from pathlib import PurePosixPath

    from pycli.cluster.model import Host
    from pycli.jobs import slurm_watch

    monkeypatch.setattr(slurm_watch, "UNAVAILABLE_GRACE_S", 1)
    monkeypatch.setattr(slurm_watch, "NODE_CHECK_S", 0.2)
    monkeypatch.setattr(slurm_watch, "RECONNECT_PAUSE_S", 0.2)
    here = Host("node1", "node1", local=True)
    said: list[str] = []
    watch = slurm_watch.SlurmWatch(here, {"node1": here}, PurePosixPath("/nonexistent"), "42", said.append,
                                   threading.Event(), **kw)
    return watch.run(), said


def test_a_queued_job_whose_node_is_drained_is_cancelled_in_one_line_naming_the_node(tmp_path, monkeypatch):
    from pycli.jobs import slurm_queue as slurm_jobs

    bin_dir = _fake_slurm(tmp_path, monkeypatch, (
        'case $1 in\n'
        '  squeue) [ -f "$d/cancelled" ] && echo "CANCELLED|None|n/a|" || '
        'echo "PENDING|ReqNodeNotAvail, UnavailableNodes:node2|n/a|" ;;\n'
        '  sinfo) printf "node1|idle|gpu:2|none\\nnode2|drained|gpu:2|gpu: row remap pending\\n" ;;\n'
        '  scancel) touch "$d/cancelled" ;;\n'
        'esac\n'))
    watched, said = _watch(monkeypatch, nodes=("node1", "node2"))
    assert (bin_dir / "cancelled").exists() and watched.last.state == "CANCELLED"
    assert watched.unavailable == "node2 (drained: gpu: row remap pending)" and not watched.lost
    assert "pycli: cancelling Slurm job 42 (scancel): it would never start" in said
    ended = slurm_jobs.ending(None, "42", False, None, unavailable=watched.unavailable)
    assert ended.code == 1 and ended.final and ended.why.startswith(
        "Slurm job 42 could not start: node2 (drained: gpu: row remap pending), a node it was submitted to for")


def test_a_job_requeued_held_is_cancelled_and_not_restarted(tmp_path, monkeypatch):
    from pycli.jobs import slurm_queue as slurm_jobs

    _fake_slurm(tmp_path, monkeypatch, (
        'case $1 in\n'
        '  squeue) [ -f "$d/cancelled" ] && echo "CANCELLED|None|n/a|" || echo "PENDING|launch failed requeued held|n/a|" ;;\n'
        '  scancel) touch "$d/cancelled" ;;\n'
        'esac\n'))
    watched, _ = _watch(monkeypatch)
    assert watched.held == "launch failed requeued held"
    ended = slurm_jobs.ending(None, "42", False, None, held=watched.held)
    assert ended.code == 1 and ended.final and "requeued held" in ended.why


def test_a_watch_whose_connection_drops_connects_again_and_sees_the_end(tmp_path, monkeypatch):
    # The watch's third squeue kills its shell (its process group), as a dropped SSH connection ends the watch.
    # The output's follower asks squeue too (for the job's state alone, -o %T): it is answered, never counted,
    # so that the drop is always the watch's (counted, it took the kill now and then, and no drop was seen).
    bin_dir = _fake_slurm(tmp_path, monkeypatch, (
        'case "$*" in *"%T|%r"*) ;; *) [ "$(cat "$d/n" 2>/dev/null || echo 0)" -ge 5 ] && echo COMPLETED || echo RUNNING; '
        'exit 0 ;; esac\n'
        'n=$(cat "$d/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$d/n"\n'
        '[ "$n" = 2 ] && kill -9 -- -$(ps -o pgid= -p $$ | tr -d " ")\n'
        '[ "$n" -ge 5 ] && echo "COMPLETED|None|node1|node1" || echo "RUNNING|None|node1|node1"\n'))
    watched, said = _watch(monkeypatch)
    assert watched.last.state == "COMPLETED" and not watched.lost, said
    assert any(line.startswith("pycli: lost the connection to node1 watching Slurm job 42") for line in said), said
    assert "pycli: watching Slurm job 42 again" in said
    assert said.count("pycli: Slurm job 42 RUNNING on node1" + said[0].split("node1", 2)[-1]) <= 1  # said once
    assert int((bin_dir / "n").read_text()) >= 6


def test_a_watch_that_cannot_connect_again_ends_as_lost_and_touches_nothing(tmp_path, monkeypatch):
    from pycli.jobs import slurm_watch

    # Every watch after the first dies at once, as ssh does when the node refuses new logins.
    bin_dir = _fake_slurm(tmp_path, monkeypatch, (
        'case $1 in\n'
        '  squeue) n=$(cat "$d/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$d/n"\n'
        '          [ "$n" -ge 2 ] && kill -9 -- -$(ps -o pgid= -p $$ | tr -d " "); echo "RUNNING|None|node1|node1" ;;\n'
        '  scancel) touch "$d/cancelled" ;;\n'
        'esac\n'))
    monkeypatch.setattr(slurm_watch, "RECONNECT_S", 2)
    watched, said = _watch(monkeypatch)
    assert watched.lost == "lost contact with node1; Slurm job 42 is still RUNNING as last seen", said
    assert not (bin_dir / "cancelled").exists()


def _answering(monkeypatch, sinfo: str) -> list[str]:
    """ssh_each of pycli.jobs.slurm_queue answering sinfo with `sinfo` and every other command with
    success; the commands it was given, in order."""
    from pycli.cluster import slurm_state
    from pycli.cluster.nodes import NodeOutput

    asked: list[str] = []

    def ssh_each(commands, timeout_s=0, shared=False):
        asked.extend(command for _, command in commands)
        return {host.name: NodeOutput(host.name, 0, sinfo if command.startswith("sinfo") else "")
                for host, command in commands}

    monkeypatch.setattr(slurm_state, "ssh_each", ssh_each)
    return asked


SINFO = "node1|drained|gpu:2|RMA GPU3, do not resume\nnode2|drained|gpu:2|fan noise\nnode3|drained|gpu:2|pycli health: x\n"


def test_undrain_resumes_pycli_s_drains_and_keeps_an_administrator_s_unless_forced(monkeypatch):
    from pycli.cluster import slurm_state
    from pycli.cluster.model import Cluster, Host

    hosts = tuple(Host(f"node{i}", f"10.0.0.{i}") for i in (1, 2, 3))
    cluster = Cluster(hosts=hosts, launcher="node1", slurm_controller="node1")
    asked = _answering(monkeypatch, SINFO)
    said: list[str] = []
    kept = slurm_state.set_resumed(cluster, ["node1", "node2", "node3"], said.append, {"node2": "fan noise"})
    assert kept == ["node1"] and asked[-1] == "scontrol update nodename=node2,node3 state=resume"
    assert said[0] == ("pycli: node1 stays drained in Slurm: its reason is not pycli's (RMA GPU3, do not resume); "
                       "'pycli undrain node1 --force' resumes it")
    assert said[1] == "Slurm: node2, node3 RESUME (jobs start there again; drained for node2: fan noise; node3: pycli health: x)"
    assert slurm_state.set_resumed(cluster, ["node1"], said.append, {}, force=True) == []
    assert asked[-1] == "scontrol update nodename=node1 state=resume"


def test_drained_again_after_provisioning_a_node_keeps_the_reason_slurm_has(monkeypatch):
    from pycli.cluster import slurm_state
    from pycli.cluster.model import Cluster, Host

    hosts = tuple(Host(f"node{i}", f"10.0.0.{i}") for i in (1, 2, 3, 4))
    cluster = Cluster(hosts=hosts, launcher="node1", slurm_controller="node1")
    asked = _answering(monkeypatch, SINFO + "node4|idle|gpu:2|none\n")
    said: list[str] = []
    slurm_state.set_drained(cluster, {"node1": "PSU swap", "node4": "PSU swap"}, said.append, keep_slurms=True)
    assert said[0] == "Slurm: node1 is drained already; its reason kept: RMA GPU3, do not resume"
    assert asked[-1].startswith("scontrol update nodename=node4 state=drain") and "node1" not in asked[-1]


def test_a_drain_goes_through_the_backup_controller_when_the_primary_host_does_not_answer(monkeypatch):
    from pycli.cluster import slurm_state
    from pycli.cluster.model import Cluster, Host
    from pycli.cluster.nodes import NodeOutput

    hosts = tuple(Host(f"node{i}", f"10.0.0.{i}") for i in (1, 2, 3))
    cluster = Cluster(hosts=hosts, launcher="node1", slurm_controller="node1", slurm_backup="node3")
    asked: list[tuple[str, str]] = []

    def ssh_each(commands, timeout_s=0, shared=False):
        asked.extend((host.name, command) for host, command in commands)
        return {host.name: NodeOutput(host.name, 255 if host.name == "node1" else 0, "") for host, _ in commands}

    monkeypatch.setattr(slurm_state, "ssh_each", ssh_each)
    said: list[str] = []
    slurm_state.set_drained(cluster, {"node2": "PSU swap"}, said.append)
    # The launcher and primary first, then the backup controller before any other node.
    assert [host for host, _ in asked] == ["node1", "node3"]
    assert asked[-1][1].startswith("scontrol update nodename=node2 state=drain")
    assert said == ["Slurm: node2 DRAIN (running jobs finish; no new job starts there)"]


def test_what_squeue_warns_on_stderr_beside_an_answer_is_not_taken_for_the_state(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text('#!/bin/bash\necho "squeue: warning: slurm.conf is newer than slurmctld\'s" >&2\n'
                                    'echo "COMPLETED|None|node1|node1"\n')
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    ran = subprocess.run(["bash", "-c", slurm.watch_command("42", interval_s=0.01)], capture_output=True, text=True,
                         timeout=60)
    assert ran.stdout.splitlines() == ["@@slurm COMPLETED|None|node1|node1", "@@slurm gone"]


def test_slurm_s_free_text_reaches_the_terminal_without_its_escape_sequences():
    # A drain reason or a pending reason is anyone's text (scontrol update ... reason=...).
    nodes = slurm_nodes.parse_sinfo_nodes("node2|drained|gpu:2|RMA \x1b[2J\x1b]0;owned\x07\n")
    assert nodes["node2"].reason == "RMA ?[2J?]0;owned?"
    (queued,) = slurm.parse_squeue("7|ana|PENDING|Nodes\x1b[31m|1|||job\n")
    assert queued.reason == "Nodes?[31m"
    assert slurm.parse_watch_line("@@slurm PENDING|x\x1by|n/a|").reason == "x?y"


def test_an_sbatch_that_timed_out_but_queued_the_job_all_the_same_has_it_cancelled(monkeypatch, tmp_path):
    from pathlib import PurePosixPath

    from pycli.cluster.model import Cluster, Host
    from pycli.cluster.nodes import NodeOutput
    from pycli.core.errors import PycliError
    from pycli.jobs import slurm_queue as slurm_jobs
    from pycli.jobs import train
    from pycli.jobs.launch import NodeLayout

    hosts = (Host("node1", "10.0.0.1", user="root"), Host("node2", "10.0.0.2", user="root"))
    cluster = Cluster(hosts=hosts, launcher="node1", inventory=tmp_path / "inventory.ini")
    plan = train.plan_job(cluster, train.JobRequest.of(np=2, workload="synthetic", scheduler="ssh"),
                          layout=NodeLayout(work_dir=PurePosixPath("/srv/pycli")), job_id="j1")
    asked: list[str] = []

    def ssh_each(commands, shared=False):
        asked.extend(command for _, command in commands)
        said = "41|pycli job j0\n42|pycli job j1\n43|\n" if commands[0][1].startswith("squeue") else ""
        return {host.name: NodeOutput(host.name, 0, said) for host, _ in commands}

    monkeypatch.setattr(slurm_jobs, "ssh_stream", lambda *a, **k: NodeOutput("node1", 255, "", "no answer within 60 s"))
    monkeypatch.setattr(slurm_jobs, "ssh_each", ssh_each)
    with pytest.raises(PycliError, match=r"refused the job: no answer within 60 s; Slurm job 42 it queued meanwhile is "
                                         r"cancelled$"):
        slurm_jobs.submit(plan, "#!/bin/bash\n")
    assert asked == [slurm.comments_command(), "scancel 42"]
    # A refusal of sbatch's own queued nothing: nothing is looked for.
    asked.clear()
    monkeypatch.setattr(slurm_jobs, "ssh_stream", lambda *a, **k: NodeOutput(
        "node1", 1, "", "sbatch: error: Batch job submission failed: Invalid account\n"))
    with pytest.raises(PycliError, match="Invalid account$"):
        slurm_jobs.submit(plan, "#!/bin/bash\n")
    assert asked == []


def test_a_job_over_a_per_user_limit_by_itself_is_cancelled_and_one_behind_the_user_s_other_job_waits(
        tmp_path, monkeypatch):
    # QOSMaxGRESPerUser without DenyOnLimit: while another job of the user runs, the job waits its
    # turn; with none running, the job alone is over the limit and would wait for ever.
    bin_dir = _fake_slurm(tmp_path, monkeypatch, (
        'case $1 in\n'
        '  squeue) case "$*" in\n'
        '      *"-o %u"*) echo root ;;\n'
        '      *" -u "*) cat "$d/running" 2>/dev/null ;;\n'
        '      *) [ -f "$d/cancelled" ] && echo "CANCELLED|None|n/a|" || echo "PENDING|QOSMaxGRESPerUser|n/a|" ;;\n'
        '    esac ;;\n'
        '  scancel) touch "$d/cancelled" ;;\n'
        'esac\n'))
    (bin_dir / "running").write_text("41\n")
    import threading

    ended: list[float] = []
    threading.Timer(3, lambda: (ended.append(time.time()), (bin_dir / "running").write_text(""))).start()
    watched, said = _watch(monkeypatch)  # the user's other job ends 3 s in
    assert ended and (bin_dir / "cancelled").stat().st_mtime >= ended[0]  # not cancelled while it ran
    assert watched.held == ("QOSMaxGRESPerUser: over a per-user limit of its QOS or account by itself, no other job "
                            "of its user running"), said
    assert (bin_dir / "cancelled").exists()
    assert slurm.held_for_good("QOSMaxGRESPerUser") is None and slurm.held_for_good("Resources", alone=True) is None
