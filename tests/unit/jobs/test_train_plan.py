"""`pycli train`'s planning: hosts, command lines for each launcher, bad input. No SSH, no Ansible."""

import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from pycli.cluster.model import Cluster, Host
from pycli.cluster.nodes import ssh_argv
from pycli.core.errors import BadInput
from pycli.core.paths import WORKLOADS_DIR
from pycli.jobs.containers import JobContainer
from pycli.jobs.files import content_digest, stage_items
from pycli.jobs.launch import JobPlan, NodeLayout, launch_commands, remote_data_dir, workload_args
from pycli.jobs.train import JobRequest, job_record, plan_job, read_metrics
from tests.conftest import ROOT

# A small folder of files standing in for a dataset (plan_job names data by its content).
DATA = ROOT / "tests" / "fixtures" / "recorded"

LAYOUT = NodeLayout()


def cluster(slots=(2, 2), launcher=None, user="root"):
    hosts = tuple(Host(name=f"n{i + 1}", address=f"10.9.0.{i + 1}", user=user, slots=s) for i, s in enumerate(slots))
    return Cluster(hosts=hosts, launcher=launcher or hosts[0].name)


def plan(c=None, **kw):
    args = dict(np=4, workload="mnist", launcher=None, controller="gloo", script_args=(), data_dir=DATA)
    args.update(kw)
    return plan_job(c or cluster(), JobRequest.of(**args), layout=LAYOUT, job_id="j1")


def only_line(p):
    ((host, line),) = launch_commands(p)
    return host, shlex.split(line.split(" && exec env ", 1)[1])


def test_horovodrun_gets_the_filled_hosts_and_the_controller():
    p = plan(np=3, controller="gloo")
    host, argv = only_line(p)
    assert host.name == "n1" and argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:1"
    assert argv[2:4] == [NodeLayout().tool("horovodrun"), "-np"] or argv[argv.index("-np") + 1] == "3"
    assert "--gloo" in argv and "--mpi" not in argv
    assert argv[argv.index("--data-dir") + 1] == str(remote_data_dir(p)) == f"/srv/pycli/files/{p.data_digest}"
    assert argv[argv.index("--metrics") + 1] == "/srv/pycli/jobs/j1/metrics.jsonl"
    _, mpi_argv = only_line(plan(controller="mpi"))
    assert "--mpi" in mpi_argv


def test_mpirun_uses_the_seed_flags_and_the_network_interface():
    host, argv = only_line(plan(launcher="mpirun", network_interface="eth1"))
    line = " ".join(argv)
    for flags in ("-bind-to none", "-map-by slot", "-mca pml ob1", "-mca btl ^openib", "-mca btl_tcp_if_include eth1",
                  "-x NCCL_SOCKET_IFNAME=eth1", "--allow-run-as-root"):
        assert flags in line
    _, as_user = only_line(plan(c=cluster(user="train"), launcher="mpirun"))
    assert "--allow-run-as-root" not in as_user


def test_torchrun_starts_one_launcher_per_node_with_its_rank():
    p = plan(workload="ddp", np=4)
    commands = launch_commands(p)
    assert [h.name for h, _ in commands] == ["n1", "n2"]
    for rank, (host, line) in enumerate(commands):
        argv = shlex.split(line.split(" && exec env ", 1)[1])
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.9.0.1"
        assert argv[argv.index("--nproc-per-node") + 1] == "2"


def test_torchrun_rendezvous_is_the_job_s_own_on_the_port_staging_found():
    """Two jobs never share a rendezvous: the id is the job's, the port the one found free on rank 0's node."""
    p = replace(plan(workload="ddp", np=4), rendezvous_port=41234)
    for _, line in launch_commands(p):
        argv = shlex.split(line.split(" && exec env ", 1)[1])
        assert argv[argv.index("--master-port") + 1] == "41234"
        assert argv[argv.index("--rdzv-id") + 1] == "j1"


def test_the_launcher_node_comes_first_and_runs_rank_0():
    p = plan(c=cluster(slots=(1, 1, 1), launcher="n3"), np=3)
    assert [h.name for h in p.hosts] == ["n3", "n1", "n2"] and p.rank0.name == "n3"


def test_user_arguments_come_after_pycli_s_and_resume_is_staged():
    p = plan(script_args=("--epochs", "7"), resume=Path(__file__))
    args = workload_args(p)
    assert args[-2:] == ["--epochs", "7"]
    assert args[args.index("--resume") + 1] == "/srv/pycli/jobs/j1/resume.pt"


def test_synthetic_under_torchrun_uses_ddp_and_needs_no_data():
    p = plan(workload="synthetic", launcher="torchrun", data_dir=None)
    assert "--comm" in workload_args(p) and "--data-dir" not in workload_args(p)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"np": 0}, "at least 1"),
        ({"np": 5}, "more than the 4 slots"),
        ({"workload": "resnet"}, "unknown workload 'resnet'"),
        ({"workload": "missing/train.py"}, "does not exist"),
        ({"launcher": "srun"}, "unknown --launcher"),
        ({"controller": "nccl2"}, "unknown --controller"),
        ({"workload": "mnist", "launcher": "torchrun"}, "use the ddp workload"),
        ({"workload": "ddp", "launcher": "horovod"}, "runs under torchrun"),
        ({"data_dir": Path("/nonexistent")}, "is not a folder"),
        ({"resume": Path("/nonexistent.pt")}, "does not exist"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(kw, message):
    with pytest.raises(BadInput, match=message):
        plan(**kw)


def test_ssh_keeps_host_key_checking_and_takes_the_inventory_options():
    host = Host(name="n1", address="10.9.0.1", port=2222, user="root", ssh_options=("-i", "/k", "-o", "UserKnownHostsFile=/kh"))
    argv = ssh_argv(host, "hostname")
    assert "StrictHostKeyChecking=yes" in argv and argv[-5:] == ["-l", "root", "--", "10.9.0.1", "hostname"]
    assert argv[argv.index("-p") + 1] == "2222" and "/k" in argv and "UserKnownHostsFile=/kh" in argv
    assert all("StrictHostKeyChecking=no" not in a for a in argv)


def test_a_job_s_ssh_gives_up_on_a_node_that_stops_answering():
    argv = ssh_argv(Host(name="n1", address="10.9.0.1"), "hostname")
    options = [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]
    assert {"ServerAliveInterval=15", "ServerAliveCountMax=4", "ConnectTimeout=10"} <= set(options)


def test_neither_the_user_nor_the_host_can_become_an_ssh_option():
    # Both are refused when the inventory is read; should one get this far, ssh still reads
    # the user as -l's value and the host after "--", never as an option.
    host = Host(name="n1", address="-oProxyCommand=touch${IFS}pwned", user="-oProxyCommand=touch${IFS}pwned")
    argv = ssh_argv(host, "hostname")
    end = argv.index("--")
    assert argv[end + 1:] == [host.address, "hostname"]
    assert [i for i, word in enumerate(argv[:end]) if word.startswith("-oProxyCommand")] == [argv.index("-l") + 1]


@pytest.mark.parametrize(
    ("settings", "request_nic", "message"),
    [
        ({}, "eth0$(touch${IFS}/tmp/pwned)",
         "--network-interface 'eth0$(touch${IFS}/tmp/pwned)' is not a network interface name"),
        ({}, "-eth0", "--network-interface '-eth0' is not"),
        ({"pycli_network_interface": "eth0 eth1"}, None, "pycli_network_interface 'eth0 eth1' is not a network interface name"),
    ],
)
def test_a_network_interface_that_is_no_interface_name_is_refused(settings, request_nic, message):
    hostile = Cluster(hosts=cluster().hosts, launcher="n1", settings=settings)
    with pytest.raises(BadInput, match=re.escape(message)):
        plan(c=hostile, network_interface=request_nic)


def test_horovodrun_names_the_interface_only_across_hosts():
    _, across = only_line(plan(np=4, network_interface="eth0"))
    assert across[across.index("--network-interface") + 1] == "eth0"
    _, single = only_line(plan(np=2, network_interface="eth0"))
    assert "--network-interface" not in single


def test_staged_sources_are_absolute_even_when_given_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.idx").write_bytes(b"12")
    (tmp_path / "container").mkdir()
    p = plan(workload="jobs/train.py", data_dir=Path("data"))
    items = stage_items(p, Path("container"))
    assert [i.src for i in items] == [tmp_path / "jobs" / "train.py", tmp_path / "data", tmp_path / "container"]
    assert [i.how for i in items] == ["file", "data", "direct"]
    assert str(items[0].dest) == "/srv/pycli/jobs/j1/workloads/train.py" and str(items[2].dest) == "/srv/pycli/jobs/j1/container"
    assert items[1].digest == p.data_digest == content_digest(tmp_path / "data") and items[1].dest is None


def test_the_network_interface_comes_from_the_request_else_the_inventory():
    with_nic = Cluster(hosts=cluster().hosts, launcher="n1", settings={"pycli_network_interface": "ens5"})
    assert plan(c=with_nic).network_interface == "ens5"
    assert plan(c=with_nic, network_interface="eth1").network_interface == "eth1"
    assert plan().network_interface is None


def test_a_request_is_plain_frozen_data_with_the_defaults_train_uses():
    request = JobRequest.of(np=2)
    assert (request.launch.workload, request.launch.launcher, request.launch.controller, request.launch.script_args) == ("mnist", None, "gloo", ())
    assert request.placement.network_interface is request.data.data_dir is request.data.resume is request.container is None
    with pytest.raises(AttributeError):
        request.placement.np = 3  # type: ignore[misc]


def test_a_job_needs_a_cluster_read_from_an_inventory(tmp_path):
    from pycli.jobs.train import run_job

    with pytest.raises(ValueError, match="not read from an inventory"):
        run_job(cluster(), JobRequest.of(np=2, workload="synthetic"), run_dir=tmp_path, write=lambda line: None)


# ------------------------------------------- what reaches a node's shell stays one word

FAKE_PROGRAM = '#!/bin/sh\nprintf "%s\\n" "GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME" "PWD=$PWD"\n'


def _hostile_plan(tmp_path, launcher, venv="my venv", container=None):
    """A plan whose interface would run a command if unquoted, in folders that may hold spaces.

    Built directly, past plan_job's checks: the quoting must hold whatever the plan holds."""
    layout = NodeLayout(venv=PurePosixPath(tmp_path / venv), work_dir=PurePosixPath(tmp_path / "work dir"))
    workload = "ddp.py" if launcher == "torchrun" else "mnist.py"
    request = JobRequest.of(np=4, launcher=launcher, script_args=("--note", "a b;c"), container=container)
    return JobPlan(request=request, job_id="j1", launcher=launcher, np=4, hosts=cluster().hosts,
                   script=WORKLOADS_DIR / workload, layout=layout, network_interface=f"eth0$(touch${{IFS}}{tmp_path}/pwned)")


def _fake_programs(folder, names):
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(FAKE_PROGRAM)
        (folder / name).chmod(0o755)


@pytest.mark.parametrize("venv", ["venv", "my venv"])
@pytest.mark.parametrize("launcher", ["horovod", "mpirun", "torchrun"])
def test_the_shell_line_keeps_every_value_one_word_and_runs_nothing_else(tmp_path, launcher, venv):
    p = _hostile_plan(tmp_path, launcher, venv)
    _fake_programs(tmp_path / venv / "bin", ["horovodrun", "mpirun", "torchrun"])
    Path(p.job_dir).mkdir(parents=True)
    commands = launch_commands(p)
    for _, line in commands:
        assert f"GLOO_SOCKET_IFNAME={p.network_interface}" in shlex.split(line)
        run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin"})
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines() == [f"GLOO_SOCKET_IFNAME={p.network_interface}", f"PWD={p.job_dir}"]
    assert not (tmp_path / "pwned").exists()


def test_the_container_line_keeps_every_value_one_word_and_runs_nothing_else(tmp_path):
    p = _hostile_plan(tmp_path, "horovod", container=JobContainer(image="horovod/horovod:0.28.1"))
    fake_docker = tmp_path / "bin"
    fake_docker.mkdir()
    (fake_docker / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake_docker / "docker").chmod(0o755)
    ((_, line),) = launch_commands(p)
    run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{fake_docker}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert f"GLOO_SOCKET_IFNAME={p.network_interface}" in run.stdout.splitlines()
    assert not (tmp_path / "pwned").exists()


def test_a_half_written_metrics_line_is_skipped_with_a_warning(tmp_path, capsys):
    # A rank killed mid-write leaves the last line cut short (and maybe a torn UTF-8 byte).
    (tmp_path / "metrics.jsonl").write_bytes(b'{"epoch": 1, "train_loss": 0.5}\n\n[1]\n{"epoch": 2, "train_lo\xe2\x82')
    assert read_metrics(tmp_path) == [{"epoch": 1, "train_loss": 0.5}]
    err = capsys.readouterr().err.splitlines()
    assert err == [f"pycli: warning: {tmp_path / 'metrics.jsonl'}: skipped 2 line(s) that are not a JSON record (first: line 3)"]


def test_env_settings_reach_every_rank_after_pycli_s_own():
    from dataclasses import replace

    staged = replace(plan(env=("HOROVOD_CYCLE_TIME=5", "OMP_NUM_THREADS=3")), node_cpus=(("n1", 8), ("n2", 8)))
    _, argv = only_line(staged)
    settings = argv[:argv.index(NodeLayout().tool("horovodrun"))]
    # pycli's threads first, the user's after: env(1) keeps the last value it is given.
    assert settings.index("OMP_NUM_THREADS=4") < settings.index("OMP_NUM_THREADS=3")
    assert "HOROVOD_CYCLE_TIME=5" in settings
    _, mpi = only_line(replace(staged, launcher="mpirun"))
    exported = [mpi[i + 1] for i, word in enumerate(mpi) if word == "-x"]
    assert "HOROVOD_CYCLE_TIME" in exported and exported.count("OMP_NUM_THREADS") == 1


@pytest.mark.parametrize("setting", ["NOEQUALS", "1BAD=x", "A-B=1", "=1"])
def test_an_env_setting_that_is_no_name_value_pair_is_bad_input(setting):
    with pytest.raises(BadInput, match="--env"):
        plan(env=(setting,))


def test_autotune_is_horovodrun_s_and_its_log_comes_back_with_the_results():
    from pycli.jobs.files import RESULTS_LINE

    _, argv = only_line(plan(autotune=True))
    assert argv[argv.index("--autotune-log-file") + 1] == "/srv/pycli/jobs/j1/autotune.csv" and "--autotune" in argv
    assert "autotune.csv" in RESULTS_LINE
    with pytest.raises(BadInput, match="--autotune"):
        plan(workload="synthetic", launcher="torchrun", data_dir=None, autotune=True)


def test_horovod_s_cpu_settings_apply_where_staging_found_no_gpu():
    from dataclasses import replace

    from pycli.jobs.launch import HOROVOD_CPU_ENV

    base = plan()
    cpu = replace(base, node_cpus=(("n1", 8), ("n2", 8)), node_gpus=(("n1", 0), ("n2", 0)))
    gpu = replace(cpu, node_gpus=(("n1", 0), ("n2", 8)))
    assert HOROVOD_CPU_ENV and all(setting in only_line(cpu)[1] for setting in HOROVOD_CPU_ENV)
    assert not any(setting in only_line(gpu)[1] for setting in HOROVOD_CPU_ENV)
    assert not any(setting in only_line(base)[1] for setting in HOROVOD_CPU_ENV)  # not staged: nothing known
    torchrun = replace(cpu, launcher="torchrun", rendezvous_port=29500)
    assert not any(setting in line for _, line in launch_commands(torchrun) for setting in HOROVOD_CPU_ENV)
    name = HOROVOD_CPU_ENV[0].split("=")[0]
    _, argv = only_line(replace(cpu, request=cpu.request.with_(env=(f"{name}=1",))))
    assert argv.index(f"{name}=1") > argv.index(HOROVOD_CPU_ENV[0])  # the user's value comes later and wins


def test_a_built_in_workload_named_by_a_relative_path_is_staged_with_its_library(monkeypatch):
    from pycli.core.tree import PROJECT_ROOT

    monkeypatch.chdir(PROJECT_ROOT)
    (item,) = stage_items(plan(workload="workloads/allreduce.py", data_dir=None))
    assert (item.src, item.how, str(item.dest)) == (WORKLOADS_DIR, "tree", "/srv/pycli/jobs/j1/workloads")


def test_the_plan_carries_the_request_whole_and_frozen():
    from dataclasses import FrozenInstanceError, fields

    p = plan(np=3, controller="mpi", script_args=["--epochs", "2"], env=["A=1"], autotune=True)
    assert p.request.placement.np == 3 and p.request.launch.script_args == ("--epochs", "2") and p.request.launch.env == ("A=1",)
    with pytest.raises(FrozenInstanceError):
        p.request.placement.np = 5
    asked = {f.name for f in fields(JobRequest)} - {"np", "launcher", "network_interface", "data_dir", "resume"}
    assert not asked & {f.name for f in fields(JobPlan)}  # only what planning decides sits beside the request
    argv = only_line(p)[1]
    assert "--mpi" in argv and argv[-2:] == ["--epochs", "2"] and "--autotune" in argv


def test_job_txt_records_the_launch_line_with_url_credentials_masked():
    p = plan(env=("HTTPS_PROXY=http://bob:hunter2@proxy:3128", "HF_ENDPOINT=https://tok-0815@hub.example"))
    record = job_record(p)
    assert "hunter2" not in record and "tok-0815" not in record
    assert "HTTPS_PROXY=http://bob:***@proxy:3128" in record and "HF_ENDPOINT=https://***@hub.example" in record
    assert "hunter2" in launch_commands(p)[0][1]  # the node itself runs the real value


def test_through_slurm_mpirun_names_the_hosts_as_slurms_allocation_does():
    slurm_cluster = replace(cluster(), slurm_controller="n1")
    through = plan(slurm_cluster, launcher="mpirun", scheduler=None)
    assert through.slurm
    _, argv = only_line(through)
    assert argv[argv.index("-H") + 1] == "n1:2,n2:2"
    direct = plan(slurm_cluster, launcher="mpirun", scheduler="ssh")
    assert not direct.slurm
    _, argv = only_line(direct)
    assert argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:2"
    # horovodrun --gloo names the hosts by address; its logins become steps of the job (below).
    _, argv = only_line(plan(slurm_cluster, scheduler=None))
    assert argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:2"
    # horovodrun --mpi hands -H to Open MPI, which inside the allocation knows Slurm's names only.
    _, argv = only_line(plan(slurm_cluster, scheduler=None, controller="mpi"))
    assert argv[argv.index("-H") + 1] == "n1:2,n2:2"


def _run_slurm_ssh(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The job's own ssh, run with a stand-in srun that prints the words it was given, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(script)
    if not (bin_dir / "srun").exists():
        (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    for tool in ("ssh", "srun"):
        (bin_dir / tool).chmod(0o755)
    return subprocess.run([str(bin_dir / "ssh"), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42"})


def test_through_slurm_horovodruns_logins_to_the_job_s_nodes_run_as_steps_of_the_job(tmp_path):
    from pycli.jobs.launch import slurm_ssh_script

    p = plan(replace(cluster(), slurm_controller="n1"), scheduler=None)
    assert p.logins_as_steps and p.slurm_ssh_dir == PurePosixPath("/srv/pycli/jobs/j1/slurm-ssh")
    host, line = launch_commands(p)[0]
    assert f"PATH=/srv/pycli/jobs/j1/slurm-ssh:{LAYOUT.venv}/bin" in line  # horovodrun finds the job's ssh first
    script = slurm_ssh_script(p)
    # As horovodrun 0.28 writes its login (the horovod role makes it check host keys): options
    # before and after the host, the command one quoted word.
    said = _run_slurm_ssh(script, tmp_path, "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=yes",
                          "10.9.0.2", "-p", "2222", "-i", "/root/.ssh/id", "-o", "ConnectTimeout=10",
                          "cd /srv/pycli/jobs/j1 > /dev/null 2>&1 ; HOROVOD_RANK=2 python -u train.py")
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines() == [
        "--nodes=1", "--ntasks=1", "--nodelist=n2", "--overlap", "--mpi=none", "--cpu-bind=none", "--quiet",
        "bash", "-c", "cd /srv/pycli/jobs/j1 > /dev/null 2>&1 ; HOROVOD_RANK=2 python -u train.py"]
    # By Slurm's name (horovodrun --mpi's host check), and the words of a command joined as ssh joins them.
    said = _run_slurm_ssh(script, tmp_path, "-oBatchMode=yes", "root@n1", "true", "&&", "echo ok")
    assert said.stdout.splitlines()[2] == "--nodelist=n1" and said.stdout.splitlines()[-1] == "true && echo ok"
    # A host that is no node of the job is never reached: ssh's own failure code.
    said = _run_slurm_ssh(script, tmp_path, "10.9.0.9", "true")
    assert said.returncode == 255 and said.stdout == "" and "10.9.0.9 is no node of Slurm job 42" in said.stderr
    # A step Slurm could not create (slurmctld just restarted) is asked for again; a rank's own
    # failure is not, and its stderr passes on whole.
    (tmp_path / "bin" / "srun").write_text(
        '#!/bin/bash\nn=$(cat "$(dirname "$0")/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$(dirname "$0")/n"\n'
        'if [ "$n" -lt 2 ]; then echo "srun: error: Unable to create step for job 42: Memory required by task is not '
        'available" >&2; exit 1; fi\n'
        'echo "rank says: no data" >&2; echo out; exit 3\n')
    said = _run_slurm_ssh(script.replace("sleep 2", "sleep 0"), tmp_path, "10.9.0.2", "python", "-u", "train.py")
    assert (said.returncode, said.stdout) == (3, "out\n"), said
    assert said.stderr.count("Unable to create step") == 2 and said.stderr.endswith("rank says: no data\n"), said.stderr
    assert (tmp_path / "bin" / "n").read_text().strip() == "3"
    # The file that keeps srun's first stderr line is made beside the script, in the job's folder, and gone after.
    (tmp_path / "bin" / "srun").write_text('#!/bin/bash\nls -a "$(dirname "$0")" >&2; exit 5\n')
    said = _run_slurm_ssh(script, tmp_path, "10.9.0.2", "true")
    assert said.returncode == 5 and ".first." in said.stderr and not list((tmp_path / "bin").glob(".first.*")), said
    # Over SSH, and in containers, horovodrun logs in as ever.
    assert not plan(replace(cluster(), slurm_controller="n1"), scheduler="ssh").logins_as_steps
    assert not plan(replace(cluster(), slurm_controller="n1"), scheduler=None, launcher="mpirun").logins_as_steps
    items = stage_items(p, slurm_ssh=Path("slurm-ssh"))
    assert items[-1].how == "direct" and items[-1].dest == p.slurm_ssh_dir


def test_through_slurm_torchrun_meets_by_c10d_named_after_the_slurm_job():
    """The issue's shape: one torchrun per node, c10d on the allocation's first node, the job id as the
    rendezvous id and a port of the job's own (the batch script exports both as it starts: torchrun
    reads PET_RDZV_ID and PET_RDZV_ENDPOINT when its command line names neither)."""
    p = plan(replace(cluster(), slurm_controller="n1"), workload="ddp", np=4, scheduler=None)
    assert p.slurm and p.ranks_by_rendezvous
    for host, line in launch_commands(p):
        argv = shlex.split(line.split(" && exec env ", 1)[1])
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert "--rdzv-endpoint" not in argv
        assert argv[argv.index("--local-addr") + 1] == host.address
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert "--rdzv-id" not in argv and "--node-rank" not in argv and "--max-restarts" not in argv
    direct = plan(replace(cluster(), slurm_controller="n1"), workload="ddp", np=4, scheduler="ssh")
    assert not direct.ranks_by_rendezvous
    assert not plan(replace(cluster(), slurm_controller="n1"), workload="ddp", np=2, scheduler=None).ranks_by_rendezvous


def test_through_slurm_elastic_torchrun_meets_by_c10d_and_its_agents_restart():
    p = plan(replace(cluster(), slurm_controller="n1"), workload="ddp", np=4, scheduler=None, elastic=True, min_np=2)
    assert p.slurm and p.restarts_by_agents
    for host, line in launch_commands(p):
        argv = shlex.split(line.split(" && exec env ", 1)[1])
        assert argv[argv.index("--nnodes") + 1] == "1:2" and argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert "--max-restarts" in argv and "--rdzv-id" not in argv  # the Slurm job's id, from the batch script
