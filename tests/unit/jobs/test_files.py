"""Job folders on the nodes: staging (pycli_node/stage-job.sh, driven by pycli.jobs.files)
sends a node only what its store lacks and keeps the newest `pycli_jobs_kept` job folders;
a --docker job's container files (its private keys) go when the job ends.

The stage script runs here with bash on temporary folders, as a node runs it; `stage` and
`collect` run end to end through an `ssh` that runs its command on this machine."""

import io
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from pycli.core.paths import NODE_PACKAGE
from tests.conftest import ROOT, run_tasks_locally

SCRIPT = NODE_PACKAGE / "stage-job.sh"


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


def stage_script(mode: str, job_dir: Path, keep="20", *items: str, port="0", stdin: bytes = b"") -> subprocess.CompletedProcess:
    store = job_dir.parent.parent / "files"
    return subprocess.run(["bash", str(SCRIPT), mode, str(job_dir), str(store), str(keep), port, *items],
                          input=stdin, capture_output=True)


def lines(done: subprocess.CompletedProcess, word: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in done.stdout.decode().splitlines() if line.startswith(word + " ")]


def test_staging_keeps_the_newest_job_folders_and_this_job(jobs):
    current = "20261124-200000-7"
    done = stage_script("check", jobs / current, 20)
    assert done.returncode == 0, done.stderr
    ids = job_ids(25)
    kept = sorted(p.name for p in jobs.iterdir())
    # 20 in all: this job and the 19 newest before it; "-99" is older than "-124" of the same second.
    by_age = sorted(ids, key=lambda j: (j.rsplit("-", 1)[0], int(j.rsplit("-", 1)[1])))
    assert kept == sorted([*by_age[-19:], current, "notes"])
    assert sorted(lines(done, "removed")) == sorted(by_age[:-19])
    again = stage_script("check", jobs / current, 20)
    assert lines(again, "removed") == [] and sorted(p.name for p in jobs.iterdir()) == kept
    assert lines(again, "cpus") == [subprocess.check_output(["nproc"]).decode().strip()]


def test_zero_keeps_all(jobs):
    stage_script("check", jobs / "20261124-200000-7", 0)
    assert len(list(jobs.iterdir())) == 26 + 2  # with "notes" and this job


def test_a_job_folder_a_running_process_names_is_kept(jobs):
    oldest = job_ids(25)[0]
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(jobs / oldest / "workloads" / "x.py")])
    try:
        stage_script("check", jobs / "20261124-200000-7", 5)
        assert (jobs / oldest).is_dir() and len([p for p in jobs.iterdir() if p.name != "notes"]) == 6
    finally:
        running.kill()
        running.wait()


def _squeue(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text("#!/bin/bash\n" + script)
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_the_folder_and_store_entries_of_a_job_slurm_still_queues_are_kept(jobs, tmp_path, monkeypatch):
    # A queued job has no process yet: Slurm's word (its work folder in squeue) keeps its folder,
    # and the store entries its folder says it reads.
    oldest = job_ids(25)[0]
    store = jobs.parent / "files"
    names = [f"{i:032x}" for i in range(4)]
    for age, name in enumerate(names):
        (store / name).mkdir(parents=True)
        os.utime(store / name, (1_000_000 + age, 1_000_000 + age))
    (jobs / oldest / ".store-items").write_text(f"{names[0]}\n")
    _squeue(tmp_path, monkeypatch, f'echo {jobs / oldest}\necho /home/ana/other-job\n')
    done = stage_script("check", jobs / "20261124-200000-7", 2, f"{names[3]}:data:")
    assert done.returncode == 0, done.stderr
    assert (jobs / oldest).is_dir() and len([p for p in jobs.iterdir() if p.name != "notes"]) == 3
    assert sorted(p.name for p in store.iterdir()) == sorted([names[0], names[2], names[3]])
    assert (jobs / "20261124-200000-7" / ".store-items").read_text().split() == [names[3]]


def test_nothing_is_pruned_while_slurm_cannot_say_which_jobs_it_has(jobs, tmp_path, monkeypatch):
    _squeue(tmp_path, monkeypatch, 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1\n')
    done = stage_script("check", jobs / "20261124-200000-7", 5)
    assert done.returncode == 0 and lines(done, "removed") == [], done.stderr
    assert len([p for p in jobs.iterdir() if p.name != "notes"]) == 27


@pytest.mark.parametrize("kept", ["many", "-1", "2.5", ""])
def test_a_count_that_is_no_whole_number_changes_nothing_and_names_the_variable(jobs, kept):
    from pycli.core.errors import BadInput
    from pycli.jobs.files import jobs_kept

    done = stage_script("check", jobs / "20261124-200000-7", kept)
    assert done.returncode == 2 and b"pycli_jobs_kept" in done.stderr
    assert len(list(jobs.iterdir())) == 26 + 1
    if kept:  # pycli says so before any node is asked; unset is the default, 20
        with pytest.raises(BadInput, match="pycli_jobs_kept"):
            jobs_kept(kept)
    assert jobs_kept(None) == jobs_kept("") == 20 and jobs_kept(" 3 ") == 3


# --- the store: what a node holds is not sent again ---------------------------------------------


def items_for(tmp_path: Path, job_dir: Path):
    from pycli.jobs.files import StageItem, content_digest

    workloads = tmp_path / "controller" / "workloads"
    (workloads / "__pycache__").mkdir(parents=True, exist_ok=True)
    if not (workloads / "train.py").exists():
        (workloads / "train.py").write_text("print('hi')\n")
    (workloads / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"cache")
    (data := tmp_path / "controller" / "data").mkdir(exist_ok=True)
    (data / "images.idx").write_bytes(b"\0" * 1000)
    resume = tmp_path / "controller" / "last.pt"
    resume.write_bytes(b"weights")
    keys = tmp_path / "controller" / "container"
    keys.mkdir(exist_ok=True)
    (keys / "id_ed25519").write_text("PRIVATE")
    (keys / "id_ed25519").chmod(0o600)
    job = PurePosixPath(job_dir)
    return [StageItem(workloads, "tree", job / "workloads", content_digest(workloads)),
            StageItem(data, "data", None, content_digest(data)),
            StageItem(resume, "file", job / "resume.pt", content_digest(resume)),
            StageItem(keys, "direct", job / "container", "d" * 32)]


def tar_of(items) -> bytes:
    from pycli.jobs.files import write_tar

    out = io.BytesIO()
    write_tar(items, out)
    return out.getvalue()


def test_a_node_is_sent_what_its_store_lacks_once_and_later_jobs_link_it(tmp_path):
    work = tmp_path / "srv"
    first = work / "jobs" / "20261124-200000-7"
    items = items_for(tmp_path, first)
    words = [i.word for i in items]
    asked = stage_script("check", first, 20, *words)
    assert asked.returncode == 0, asked.stderr
    assert sorted(lines(asked, "need")) == sorted(i.digest for i in items)
    got = stage_script("receive", first, 20, *words, stdin=tar_of(items))
    assert got.returncode == 0, got.stderr
    assert (first / "workloads" / "train.py").read_text() == "print('hi')\n"
    assert not (first / "workloads" / "__pycache__").exists()  # byte-code is the node's own
    assert (first / "resume.pt").read_bytes() == b"weights"
    assert (work / "files" / items[1].digest / "images.idx").stat().st_size == 1000  # data is read in place
    assert (first / "container" / "id_ed25519").read_text() == "PRIVATE"
    assert (first / "container" / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert not list((work / "files").glob("d" * 32)) and not list((work / "files").glob(".incoming-*"))

    # The next job with the same files: only its own private keys are needed, the rest is linked.
    second = work / "jobs" / "20261124-200100-8"
    items = items_for(tmp_path, second)
    asked = stage_script("check", second, 20, *(i.word for i in items))
    assert lines(asked, "need") == ["d" * 32]
    assert (second / "workloads" / "train.py").stat().st_ino == (first / "workloads" / "train.py").stat().st_ino
    # A changed workload has a new name, and only it is sent.
    (tmp_path / "controller" / "workloads" / "train.py").write_text("print('changed')\n")
    changed = items_for(tmp_path, second)
    asked = stage_script("check", second, 20, *(i.word for i in changed))
    assert sorted(lines(asked, "need")) == sorted([changed[0].digest, "d" * 32])


def test_the_store_keeps_the_newest_entries_and_those_in_use(tmp_path):
    store = tmp_path / "srv" / "files"
    names = [f"{i:032x}" for i in range(6)]
    for age, name in enumerate(names):
        (store / name).mkdir(parents=True)
        os.utime(store / name, (1_000_000 + age, 1_000_000 + age))
    reading = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--data-dir", str(store / names[0])])
    try:
        done = stage_script("check", tmp_path / "srv" / "jobs" / "20261124-200000-7", 2, f"{names[1]}:data:")
        assert done.returncode == 0, done.stderr
    finally:
        reading.kill()
        reading.wait()
    # Kept: the newest two (this job's entry, touched now, and names[5]), and the one a job reads.
    assert sorted(p.name for p in store.iterdir()) == sorted([names[0], names[1], names[5]])


# --- end to end through pycli.jobs.files, an `ssh` that runs its command here --------------------


@pytest.fixture
def local_ssh(tmp_path, monkeypatch):
    """`ssh` that runs its last argument with bash on this machine: the transport only is stood in for."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\necho "${@: -2:1}" >> "$(dirname "$0")/calls"\nexec bash -c "${@: -1}"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / "calls"


def _cluster(tmp_path):
    from pycli.cluster.model import Cluster, Host

    hosts = (Host("n1", "10.9.0.1", user="root", slots=2), Host("n2", "10.9.0.2", user="root", slots=2))
    return Cluster(hosts=hosts, launcher="n1", inventory=tmp_path / "inventory.ini")


def _plan(tmp_path, **kw):
    from pycli.jobs import train
    from pycli.jobs.launch import NodeLayout

    layout = NodeLayout(work_dir=PurePosixPath(tmp_path / "srv"))
    request = train.JobRequest.of(np=4, workload=kw.pop("workload", "synthetic"), **kw)
    return train.plan_job(_cluster(tmp_path), request, layout=layout, job_id="20261124-200000-7")


def test_stage_then_collect_over_ssh(tmp_path, local_ssh):
    from pycli.jobs import files as job_files
    from pycli.jobs.launch import launch_commands, rank_threads

    plan = _plan(tmp_path, launcher="torchrun")
    assert rank_threads(plan) is None  # before staging counted the cores
    staged = job_files.stage(plan, tmp_path)
    job_dir = Path(staged.job_dir)
    assert (job_dir / "workloads" / "synthetic.py").is_file() and (job_dir / "workloads" / "wl_loop.py").is_file()
    cores = int(subprocess.check_output(["nproc"]))
    assert staged.rendezvous_port and dict(staged.node_cpus) == {"n1": cores, "n2": cores}
    assert rank_threads(staged) == max(1, cores // 2)
    assert all(f"OMP_NUM_THREADS={max(1, cores // 2)}" in line for _, line in launch_commands(staged))
    assert "lacked nothing" not in (tmp_path / "stage.txt").read_text()
    calls = local_ssh.read_text().count("\n")
    job_files.stage(plan, tmp_path)  # again: both nodes (one machine here) hold everything
    assert local_ssh.read_text().count("\n") == calls + 2  # one check each, nothing received
    assert (tmp_path / "stage.txt").read_text().count("lacked nothing") == 2

    (job_dir / "checkpoints").mkdir()
    (job_dir / "checkpoints" / "last.pt").write_bytes(b"weights")
    (job_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (job_dir / "resume.pt").write_bytes(b"what it started from")
    job_files.collect(staged, tmp_path / "results")
    got = sorted(str(p.relative_to(tmp_path / "results")) for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert got == ["checkpoints/last.pt", "metrics.jsonl"]
    assert job_files.stop_strays(staged) == {}


def test_threads_per_rank_given_or_shared_out():
    from dataclasses import replace

    from pycli.cluster.model import Cluster, Host
    from pycli.jobs.launch import NodeLayout, launch_commands, rank_threads
    from pycli.jobs.train import JobRequest, plan_job

    hosts = (Host("n1", "10.9.0.1", slots=4), Host("n2", "10.9.0.2", slots=2))
    cluster = Cluster(hosts=hosts, launcher="n1")
    plan = plan_job(cluster, JobRequest.of(np=6, workload="synthetic"), layout=NodeLayout(), job_id="j1")
    staged = replace(plan, node_cpus=(("n1", 16), ("n2", 16)))
    assert rank_threads(staged, [hosts[0]]) == 4 and rank_threads(staged, [hosts[1]]) == 8
    assert rank_threads(staged) == 4  # horovodrun passes one value to every rank: the fewest cores a rank has
    ((_, line),) = launch_commands(staged)
    assert "OMP_NUM_THREADS=4" in line
    torchrun = replace(staged, launcher="torchrun", rendezvous_port=29500)
    assert [("OMP_NUM_THREADS=4" in a, "OMP_NUM_THREADS=8" in b) for (_, a), (_, b) in [launch_commands(torchrun)]] == [(True, True)]
    mpirun = replace(staged, launcher="mpirun")
    ((_, line),) = launch_commands(mpirun)
    assert "-x OMP_NUM_THREADS" in line and "OMP_NUM_THREADS=4" in line
    assert rank_threads(replace(staged, nodes_share_cpus=True)) == 2  # 16 cores, all 6 ranks on one machine: 16 // 6
    assert rank_threads(replace(staged, request=staged.request.with_(threads_per_rank=3))) == 3
    assert rank_threads(replace(staged, node_cpus=(("n1", 2), ("n2", 2)))) == 1  # never 0
    with pytest.raises(Exception, match="--threads-per-rank 0"):
        plan_job(cluster, JobRequest.of(np=6, workload="synthetic", threads_per_rank=0), layout=NodeLayout(), job_id="j1")


@pytest.mark.slow_ansible
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


def test_a_docker_job_whose_staging_fails_still_removes_what_reached_the_nodes(tmp_path, monkeypatch):
    from pycli.core.errors import PycliError
    from pycli.jobs import runners, train
    from pycli.jobs.containers import JobContainer

    removed = []

    def failing_stage(plan, run_dir, container_files=None):
        raise PycliError("staging the job failed: n2: disk full")

    monkeypatch.setattr(train, "stage", failing_stage)
    monkeypatch.setattr(runners.SshRunner, "containers_down", lambda self, plan: removed.append(plan.job_id))
    request = train.JobRequest.of(np=4, workload="synthetic", container=JobContainer("img"))
    with pytest.raises(PycliError, match="disk full"):
        train.run_job(_cluster(tmp_path), request, run_dir=tmp_path / "run", write=lambda line: None)
    assert len(removed) == 1
    assert not any((tmp_path / "run" / "container").glob("id_*"))  # nor on the controller




def test_what_the_stage_script_says_is_read_line_by_line():
    from pycli.jobs.files import parse_stage

    said = parse_stage("removed 20261124-100000-101\nkept-back rm: cannot remove 'x/last.pt': Permission denied\n"
                       f"need {'a' * 32}\ncpus 64\ngpus 8\nport 41234\nnoise\n")
    assert (said.cpus, said.gpus, said.port, said.needs) == (64, 8, 41234, {"a" * 32})
    assert said.removed == ("20261124-100000-101",) and said.kept_back == ("rm: cannot remove 'x/last.pt': Permission denied",)


def test_a_dead_kept_connection_is_closed_and_the_command_runs_once_more(tmp_path, monkeypatch):
    """The node restarted: its kept connection's master runs on but ssh fails through it (255)."""
    from pycli.cluster.model import Host
    from pycli.cluster.nodes import ssh_each

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # n1: a stale master (check finds it; commands fail until it is told to exit); n2: down, no master.
    (bin_dir / "ssh").write_text(f"""#!/bin/bash
host=${{@: -1}}; [ "${{@: -4:1}}" = "-O" ] && op=${{@: -3:1}} || {{ op=run; host=${{@: -2:1}}; }}
echo "$op $host" >> {tmp_path}/calls
case $op:$host in
    check:10.0.0.1) [ -e {tmp_path}/closed ] && exit 255 || exit 0 ;;
    exit:10.0.0.1) touch {tmp_path}/closed; exit 0 ;;
    check:*|exit:*) exit 255 ;;
    run:10.0.0.1) [ -e {tmp_path}/closed ] && {{ echo fine; exit 0; }}; echo "mux_client_request_session: read from master failed" >&2; exit 255 ;;
    run:*) echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255 ;;
esac
""")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    hosts = [Host("n1", "10.0.0.1"), Host("n2", "10.0.0.2")]
    answers = ssh_each([(h, "true") for h in hosts], shared=True)
    assert answers["n1"].ok and answers["n1"].stdout == "fine\n"
    assert answers["n2"].rc == 255 and "No route" in answers["n2"].why()
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls.count("run 10.0.0.1") == 2 and calls.count("run 10.0.0.2") == 1  # the down node is not tried twice
    (tmp_path / "calls").unlink()
    assert ssh_each([(hosts[1], "true")])["n2"].rc == 255  # a new login each time: never retried
    assert (tmp_path / "calls").read_text().splitlines() == ["run 10.0.0.2"]


def test_commands_that_wait_for_each_other_all_get_their_stdin_at_once(tmp_path, monkeypatch):
    """The two ranks of a pair's allreduce each read the probes from stdin, then wait for the
    other: stdin handed to one command after the other has ended would leave both waiting."""
    from pycli.cluster.model import Host
    from pycli.cluster.nodes import ssh_each

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Each "node" reads its stdin whole, says it is there, then waits up to 10 s for the other.
    (bin_dir / "ssh").write_text(f"""#!/bin/bash
host=${{@: -2:1}}; cat > {tmp_path}/stdin-$host; touch {tmp_path}/here-$host
for _ in $(seq 100); do [ "$(ls {tmp_path}/here-* | wc -l)" = 2 ] && {{ echo met; exit 0; }}; sleep 0.1; done
echo "the other rank never came" >&2; exit 1
""")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    hosts = [Host("n1", "10.0.0.1"), Host("n2", "10.0.0.2")]
    bundle = os.urandom(256 * 1024)  # more than a pipe holds: written while the other waits
    answers = ssh_each([(h, "probe") for h in hosts], timeout_s=30, stdin=bundle)
    assert [answers[h.name].stdout for h in hosts] == ["met\n", "met\n"], {h.name: answers[h.name].why() for h in hosts}
    assert (tmp_path / "stdin-10.0.0.1").read_bytes() == (tmp_path / "stdin-10.0.0.2").read_bytes() == bundle


def _stale_master_ssh(tmp_path, monkeypatch, run_line: str) -> Path:
    """An `ssh` whose kept connection to 10.0.0.1 is dead until it is told to exit; then it runs `run_line`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"""#!/bin/bash
host=${{@: -1}}; [ "${{@: -4:1}}" = "-O" ] && op=${{@: -3:1}} || {{ op=run; host=${{@: -2:1}}; }}
echo "$op $host" >> {tmp_path}/calls
case $op in
    check) [ -e {tmp_path}/closed ] && exit 255 || exit 0 ;;
    exit) touch {tmp_path}/closed; exit 0 ;;
    run) [ -e {tmp_path}/closed ] || {{ echo "mux_client_request_session: read from master failed" >&2; exit 255; }}
         {run_line} ;;
esac
""")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "calls"


def test_a_stream_through_a_dead_kept_connection_is_sent_again_whole(tmp_path, monkeypatch):
    from pycli.cluster.model import Host
    from pycli.cluster.nodes import ssh_stream

    calls = _stale_master_ssh(tmp_path, monkeypatch, f"cat > {tmp_path}/received; echo unpacked")
    answer = ssh_stream(Host("n1", "10.0.0.1"), "receive", send=lambda stdin: stdin.write(b"tar bytes"), timeout_s=30)
    assert answer.ok and answer.stdout == "unpacked\n" and (tmp_path / "received").read_bytes() == b"tar bytes"
    assert calls.read_text().splitlines().count("run 10.0.0.1") == 2


def test_a_stream_read_back_or_broken_off_says_so(tmp_path, monkeypatch):
    from pycli.cluster.model import Host
    from pycli.cluster.nodes import ssh_stream

    (tmp_path / "closed").touch()  # a live connection from the start
    _stale_master_ssh(tmp_path, monkeypatch, "printf 'results'")
    read = []
    answer = ssh_stream(Host("n1", "10.0.0.1"), "collect", receive=lambda stdout: read.append(stdout.read()), timeout_s=30)
    assert answer.ok and read == [b"results"]

    def unreadable(stdout):
        raise ValueError("not a tar stream")

    answer = ssh_stream(Host("n1", "10.0.0.1"), "collect", receive=unreadable, timeout_s=30)
    assert not answer.ok and answer.why() == "the stream broke off: not a tar stream"


def test_results_come_from_the_node_where_torchrun_s_rendezvous_put_rank_0(tmp_path, monkeypatch):
    """c10d numbers the nodes by their addresses, not the plan: rank 0's metrics may be on the second node."""
    from dataclasses import replace

    from pycli.cluster.nodes import NodeOutput
    from pycli.jobs import files as job_files

    asked = []

    def answer(pairs, shared=False):
        asked.extend(command for _, command in pairs)
        return {host.name: NodeOutput(host.name, 0 if host.name == "n2" else 1) for host, _ in pairs}

    monkeypatch.setattr(job_files, "ssh_each", answer)
    elastic = _plan(tmp_path, launcher="torchrun", elastic=True, workload="ddp")
    assert elastic.ranks_by_rendezvous and job_files.rank0_host(elastic).name == "n2"
    assert asked and all(command.startswith("test -f ") and command.endswith("/metrics.jsonl") for command in asked)
    slurm = replace(_plan(tmp_path, launcher="torchrun"), slurm=True)
    assert job_files.rank0_host(slurm).name == "n2"
    asked.clear()
    assert job_files.rank0_host(_plan(tmp_path, launcher="torchrun")).name == "n1" and asked == []  # static: the plan's
    # A node the sweep after the job could not reach is not asked again (an SSH connect timeout each).
    asked_hosts = []
    monkeypatch.setattr(job_files, "ssh_each", lambda pairs, shared=False: (
        asked_hosts.extend(host.name for host, _ in pairs) or answer(pairs, shared)))
    assert job_files.rank0_host(elastic, gone={"n2"}).name == "n1" and asked_hosts == ["n1"]


def test_the_runner_is_chosen_once_as_the_plan_chooses_the_queue(tmp_path):
    """run_job never asks which mode it runs in: its runner (pycli.jobs.runners) is Slurm's where
    the plan goes through the queue, else SSH's; a runner over SSH never loses sight of a job."""
    from dataclasses import replace as with_

    from pycli.core.errors import PycliError
    from pycli.jobs import runners, train

    plain = _cluster(tmp_path)
    slurm = with_(plain, slurm_controller=plain.hosts[0].name)
    for cluster, scheduler, kind in ((plain, None, runners.SshRunner), (slurm, None, runners.SlurmRunner),
                                     (slurm, "ssh", runners.SshRunner), (slurm, "slurm", runners.SlurmRunner)):
        request = train.JobRequest.of(np=2, workload="synthetic", scheduler=scheduler)
        runs = runners.runner_for(cluster, request, tmp_path, print)
        assert type(runs) is kind
        assert train.plan_job(cluster, request, layout=train.NodeLayout(), job_id="j").slurm == (kind is runners.SlurmRunner)
    with pytest.raises(PycliError):
        runners.SshRunner(tmp_path, tmp_path, print).follow_line()
    slurm_runs = runners.SlurmRunner(tmp_path / "c.ini", tmp_path, print)
    slurm_runs.slurm_ids.append("42")
    assert slurm_runs.follow_line() == f"follow it with 'pycli jobs {tmp_path / 'c.ini'} --attach 42'"
