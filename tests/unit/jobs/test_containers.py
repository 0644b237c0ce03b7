"""`pycli train --docker`: the checks, the key files, and the command lines run inside containers."""

import shlex
import stat
import subprocess
from pathlib import PurePosixPath

import pytest

from pycli.cluster.model import Cluster, Host
from pycli.core.errors import BadInput
from pycli.jobs import containers
from pycli.jobs.launch import NodeLayout, launch_commands
from pycli.jobs.train import JobRequest, plan_job
from tests.conftest import ROOT

# A small folder of files standing in for a dataset (plan_job names data by its content).
DATA = ROOT / "tests" / "fixtures" / "recorded"

HOSTS = (Host(name="n1", address="10.9.0.1", user="train", slots=2), Host(name="n2", address="10.9.0.2", user="train", slots=2))


def job(launcher=None, workload="mnist", options=(), port=None, slurm=False, **kw):
    container = containers.parse_job_container("horovod/horovod:0.28.1", port, options, HOSTS)
    request = JobRequest.of(np=4, workload=workload, launcher=launcher, controller=kw.pop("controller", "gloo"),
                         data_dir=DATA, container=container, scheduler="slurm" if slurm else "ssh", **kw)
    cluster = Cluster(hosts=HOSTS, launcher="n1", slurm_controller="n1" if slurm else None)
    return plan_job(cluster, request, layout=NodeLayout(), job_id="j1")


def docker_exec(line, tty="-it"):
    """Split `exec docker exec -it -w DIR -e K=V... NAME argv...` into (workdir, env, name, argv);
    a variable passed on by name alone (-e NAME) has the value None."""
    words = shlex.split(line)
    assert words[:4] == ["exec", "docker", "exec", tty]
    assert words[4] == "-w"
    workdir, rest, env = words[5], words[6:], {}
    while rest[0] == "-e":
        key, _, value = rest[1].partition("=")
        env[key] = value if _ else None
        rest = rest[2:]
    return workdir, env, rest[0], rest[1:]


@pytest.mark.parametrize("image", [
    "horovod/horovod:0.28.1", "nvcr.io/nvidia/pytorch:24.01-py3", "localhost:5000/team/job", "ubuntu",
    "pycli-test/horovod:1", "repo/img@sha256:" + "a" * 64,
])
def test_image_references_that_docker_takes(image):
    assert containers.parse_job_container(image, 12345, (), HOSTS).image == image


@pytest.mark.parametrize("image", ["", "Horovod/Horovod", "img:tag with space", "-v", "a//b", "img:", "img;rm -rf /"])
def test_image_references_refused_in_one_line(image):
    with pytest.raises(BadInput, match="is not an image reference"):
        containers.parse_job_container(image, 12345, (), HOSTS)


def test_the_sshd_port_must_be_a_port_and_not_the_nodes_own():
    with pytest.raises(BadInput, match="1..65535"):
        containers.parse_job_container("img", 0, (), HOSTS)
    with pytest.raises(BadInput, match="is the SSH port of n1, n2"):
        containers.parse_job_container("img", 22, (), HOSTS)


def test_docker_options_are_split_like_a_shell_and_may_not_replace_pycli_own():
    c = containers.parse_job_container("img", 12345, ["-v /data:/data:ro", "--ulimit memlock=-1"], HOSTS)
    assert c.run_options == ("-v", "/data:/data:ro", "--ulimit", "memlock=-1")
    for bad in ("--network=bridge", "--name x", "--entrypoint bash"):
        with pytest.raises(BadInput, match="pycli sets"):
            containers.parse_job_container("img", 12345, [bad], HOSTS)
    with pytest.raises(BadInput, match="No closing quotation"):
        containers.parse_job_container("img", 12345, ["-v 'x"], HOSTS)


def test_horovodrun_runs_in_the_launcher_container_and_reaches_the_others_on_the_sshd_port():
    ((host, line),) = launch_commands(job())
    workdir, env, name, argv = docker_exec(line)
    assert host.name == "n1" and name == "pycli-job-j1" and workdir == "/srv/pycli/jobs/j1"
    assert env["PYTHONUNBUFFERED"] == "1" and "PATH" not in env  # the image's own PATH
    assert argv[0] == "horovodrun" and argv[argv.index("-p") + 1] == "12345"
    assert argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:2"
    assert argv[argv.index("-u") - 1] == "python3"


def test_mpirun_in_a_container_runs_as_root_and_passes_the_port_to_its_ssh():
    ((_, line),) = launch_commands(job(launcher="mpirun"))
    argv = docker_exec(line)[3]
    assert argv[0] == "mpirun" and "--allow-run-as-root" in argv
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 12345"


def test_torchrun_runs_in_every_node_container():
    commands = launch_commands(job(workload="ddp"))
    assert [h.name for h, _ in commands] == ["n1", "n2"]
    for rank, (_, line) in enumerate(commands):
        argv = docker_exec(line)[3]
        assert argv[0] == "torchrun" and argv[argv.index("--node-rank") + 1] == str(rank)


def test_through_slurm_the_launchers_run_in_the_containers_without_a_tty():
    """A batch script has no terminal (scancel stops the job); inside the containers no Slurm is
    seen, so mpirun reaches the others over the containers' SSH by address, and torchrun gets the
    rendezvous id and endpoint the batch script sets."""
    ((host, line),) = launch_commands(job(slurm=True))
    assert host.name == "n1" and docker_exec(line, "-i")[3][0] == "horovodrun"
    argv = docker_exec(launch_commands(job(launcher="mpirun", slurm=True))[0][1], "-i")[3]
    assert argv[argv.index("-H") + 1] == "10.9.0.1:2,10.9.0.2:2"
    # The containers' sshd listens on the job's own port, which their ssh config names: no -p.
    assert "-p" not in docker_exec(launch_commands(job(slurm=True))[0][1], "-i")[3] and "plm_rsh_args" not in argv
    given = docker_exec(launch_commands(job(slurm=True, port=2200))[0][1], "-i")[3]
    assert given[given.index("-p") + 1] == "2200"
    for _, line in launch_commands(job(workload="ddp", slurm=True)):
        env = docker_exec(line, "-i")[1]
        assert env["PET_RDZV_ID"] is None and env["PET_RDZV_ENDPOINT"] is None  # passed on with their values in the batch script
    assert "PET_RDZV_ID" not in docker_exec(launch_commands(job(workload="ddp"))[0][1])[1]


def test_a_slurm_job_starts_its_containers_with_its_gpus_and_labels_for_the_epilog(tmp_path):
    plan = job(slurm=True)
    line = containers.slurm_start_line(plan.request.container, plan.job_id, plan.job_dir, plan.layout.work_dir)
    # Run with a start.sh that prints its arguments, in the environment a step has.
    folder = tmp_path / "container"
    folder.mkdir()
    (folder / "start.sh").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (folder / "start.sh").chmod(0o755)
    line = line.replace(str(plan.job_dir), str(tmp_path))
    step = {"SLURM_JOB_ID": "77", "PYCLI_JOB_SSH_PORT": "25077", "PATH": "/usr/bin:/bin"}  # the batch script's
    ran = subprocess.run(["bash", "-c", line], env={**step, "SLURM_STEP_GPUS": "1,3"}, capture_output=True, text=True, check=True)
    assert ran.stdout.splitlines() == ["pycli-job-j1", "horovod/horovod:0.28.1", "25077", "/srv/pycli", str(tmp_path),
                                       "1,3", "io.pycli.job=j1", "io.pycli.slurm-job=77"]
    ran = subprocess.run(["bash", "-c", line], env=step, capture_output=True, text=True, check=True)
    assert ran.stdout.splitlines()[5] == ""  # a job without GPUs: none
    given = job(slurm=True, port=2200)  # --docker-ssh-port: that port, whatever the job
    line = containers.slurm_start_line(given.request.container, given.job_id, given.job_dir, given.layout.work_dir)
    ran = subprocess.run(["bash", "-c", line.replace(str(plan.job_dir), str(tmp_path))], env=step, capture_output=True,
                         text=True, check=True)
    assert ran.stdout.splitlines()[2] == "2200"


def test_docker_options_hold_no_line_break():
    with pytest.raises(BadInput, match="cannot hold a line break"):
        containers.parse_job_container("img", 12345, ["-e 'A=x\ny'"], HOSTS)


def test_known_hosts_names_every_host_on_the_job_port():
    line = containers.known_hosts_line(HOSTS, 2222, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOK key")
    assert line.startswith("[n1]:2222,[10.9.0.1]:2222,[n2]:2222,[10.9.0.2]:2222,[localhost]:2222,")
    assert line.endswith(" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOK\n")
    # A port picked as the job starts: any port (the key is this job's alone).
    assert containers.known_hosts_line(HOSTS, None, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOK key").startswith(
        "[n1]:*,[10.9.0.1]:*,[n2]:*,")


def test_the_default_port_is_12345_over_ssh_and_the_job_s_own_through_slurm():
    assert job().request.container.port(slurm=False) == 12345 and job().request.container.port(slurm=True) is None
    assert job(port=2200).request.container.port(slurm=True) == 2200


def test_container_files_hold_working_keys_and_private_ones_can_be_forgotten(tmp_path):
    folder = tmp_path / "container"
    container = containers.parse_job_container("img", 2200, (), HOSTS)
    containers.write_container_files(folder, HOSTS, container, "j9", slurm=False)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in containers.PRIVATE_FILES:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    # The private keys are real OpenSSH keys whose public halves are the ones handed out.
    host_pub = subprocess.run(["ssh-keygen", "-y", "-f", folder / "ssh_host_ed25519_key"], capture_output=True, text=True, check=True)
    login_pub = subprocess.run(["ssh-keygen", "-y", "-f", folder / "id_ed25519"], capture_output=True, text=True, check=True)
    assert (folder / "known_hosts").read_text().split()[1:] == host_pub.stdout.split()[:2]
    assert (folder / "authorized_keys").read_text().split()[:3] == ["restrict", *login_pub.stdout.split()[:2]]
    found = subprocess.run(["ssh-keygen", "-F", "[n2]:2200", "-f", folder / "known_hosts"], capture_output=True, text=True)
    assert found.returncode == 0
    assert (folder / "entry.sh").read_text().startswith("#!/bin/sh")
    assert (folder / "start.sh").read_text().startswith("#!/bin/bash")
    containers.forget_private_keys(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["authorized_keys", "entry.sh", "known_hosts", "start.sh"]


def test_playbook_vars_name_the_job_container():
    c = containers.parse_job_container("img:1", 2200, ["--shm-size 1g"], HOSTS)
    found = containers.playbook_vars(c, "j1", PurePosixPath("/srv/pycli/jobs/j1"), PurePosixPath("/srv/pycli"), "started")
    assert found["pycli_container_name"] == "pycli-job-j1" and found["pycli_container_label"] == "io.pycli.job=j1"
    assert found["pycli_container_run_options"] == ["--shm-size", "1g"]


def _start(tmp_path, gpus, nvidia_gpus, options=""):
    """Run start.sh against a stand-in docker (it logs `docker run`'s words, then the container
    reports its sshd) and, where nvidia_gpus, an nvidia-smi listing that many GPUs."""
    bin_dir, folder = tmp_path / "bin", tmp_path / "job" / "container"
    bin_dir.mkdir(exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "start.sh").write_text(containers.START_SCRIPT.read_text())
    (folder / "run-options").write_text(options)
    run_log = tmp_path / "run.log"
    tools = {
        "docker": f'case "$1" in\n  run) shift; printf "%s\\n" "$@" > {run_log} ;;\n  image|version) ;;\n'
                  '  inspect) echo true ;;\n  logs) echo "Server listening on 0.0.0.0 port 12345." ;;\nesac\n',
        # -L in index order; -q with each GPU's UUID and minor number, the minors in reverse.
        "nvidia-smi": ('[ "$1" = -q ] && exec printf "%s\\n" '
                       + " ".join(f"'GPU 0000:{n:02x}:00.0' '    GPU UUID : GPU-u{n}' '    Minor Number : {nvidia_gpus - 1 - n}'"
                                  for n in range(nvidia_gpus)) + "\n"
                       + "".join(f"echo 'GPU {n}: H100 (UUID: GPU-u{n})'\n" for n in range(nvidia_gpus))
                       if nvidia_gpus else "exit 9\n"),
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    ran = subprocess.run(["bash", str(folder / "start.sh"), "pycli-job-j1", "img:1", "12399", "/srv/pycli",
                          str(tmp_path / "job"), gpus, "io.pycli.job=j1"],
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "n2"}, capture_output=True, text=True,
                         timeout=60)
    return ran, run_log.read_text().splitlines() if run_log.exists() else []


def test_start_sh_gives_the_container_the_jobs_gpus_and_the_nodes_options(tmp_path):
    ran, words = _start(tmp_path, "all", 2, "--network\nhost\n-e\nTOKEN=a b\n")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "pycli: job container pycli-job-j1 from img:1 up on n2 (GPUs: --gpus all)"
    assert words[:4] == ["--detach", "--name", "pycli-job-j1", "--label"] and "io.pycli.job=j1" in words
    assert words[words.index("--ipc"):words.index("--ipc") + 4] == ["--ipc", "host", "--cap-add", "SYS_PTRACE"]
    assert words[words.index("--network"):words.index("--network") + 4] == ["--network", "host", "-e", "TOKEN=a b"]
    assert words[-2:] == ["img:1", f"{tmp_path}/job/container/entry.sh"]
    # Slurm's GPUs of the job: with NVIDIA's runtime by index, without it their device files.
    # (GPUs 1 and 3 are /dev/nvidia1 and /dev/nvidia3, which nvidia-smi lists as its 2 and 0.)
    _, words = _start(tmp_path, "1,3", 4)
    assert words[words.index("--gpus") + 1] == '"device=GPU-u2,GPU-u0"'
    ran, _ = _start(tmp_path, "5", 4)
    assert ran.returncode == 1 and "no GPU with minor number 5" in ran.stderr
    # A real H200's nvidia-smi -q.
    (tmp_path / "bin" / "nvidia-smi").write_text(
        f'#!/bin/sh\n[ "$1" = -q ] && exec cat {DATA / "nvidia-smi-q-h200-580.txt"}\necho "GPU 0: NVIDIA H200"\n')
    folder = tmp_path / "job" / "container"
    ran = subprocess.run(["bash", str(folder / "start.sh"), "n", "img:1", "12399", "/srv/pycli", str(tmp_path / "job"), "0",
                          "io.pycli.job=j1"], env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=60)
    assert '"device=GPU-67a1f9c7-91dd-d185-5c15-b658435321f3"' in (tmp_path / "run.log").read_text().split("\n"), ran
    ran, _ = _start(tmp_path, "1", 0)
    assert ran.returncode == 1 and ran.stderr.strip() == "GPU 1 of the job has no device file /dev/nvidia1 on this node"
    _, words = _start(tmp_path, "", 2)
    assert "--gpus" not in words and "--device" not in words


@pytest.mark.parametrize("option", [
    "--privileged", "--gpus all", "--gpus=device=3", "--device /dev/nvidia3", "--device=/dev/nvidia3:/dev/nvidia3",
    "--device-cgroup-rule 'c 195:* rmw'", "--runtime nvidia", "-e NVIDIA_VISIBLE_DEVICES=all",
    "--env=NVIDIA_VISIBLE_DEVICES=3", "-v /dev:/dev", "--volume=/dev/nvidia3:/dev/nvidia3",
    "--mount type=bind,source=/dev,target=/host-dev", "--cgroup-parent /", "--shm-size 1g --privileged",
])
def test_through_slurm_no_docker_option_widens_the_containers_beyond_the_job_s_gpus(option):
    # Slurm's own GPUs reach the containers through start.sh; over SSH the option is the user's to give.
    with pytest.raises(BadInput, match=r"--docker-opt .*: through Slurm a job's containers get the GPUs and devices "
                                       r"Slurm gave the job and no others"):
        job(options=[option], slurm=True)
    assert job(options=[option]).request.container.run_options


@pytest.mark.parametrize("option", ["--shm-size 1g", "-e NCCL_DEBUG=INFO", "-v /data:/data:ro",
                                    "--mount type=bind,source=/srv/data,target=/data", "--ulimit memlock=-1"])
def test_through_slurm_other_docker_options_pass(option):
    assert job(options=[option], slurm=True).request.container.run_options == tuple(shlex.split(option))


@pytest.mark.parametrize("option", ["-e X={{ lookup('pipe', 'id') }}", "--label a={% raw %}", "-e Y={#c#}"])
def test_docker_options_hold_no_jinja_which_ansible_would_evaluate_on_the_controller(option):
    with pytest.raises(BadInput, match=r"an option cannot hold '\{\{', '\{%' or '\{#'"):
        job(options=[option])
