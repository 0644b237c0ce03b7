"""The one place that builds launcher command lines: what every mpirun pycli runs has in common."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from pycli.cluster.model import Host
from pycli.core.errors import BadInput
from pycli.health.gates import mpirun_command
from pycli.jobs.launch import MPIRUN_ENV, MPIRUN_FLAGS, job_process_pattern, mpirun_argv, ssh_port_option, stray_sweep_line

HOSTS = (Host("n1", "10.9.0.1", slots=2), Host("n2", "10.9.0.2", slots=2))


def _flag_pairs(argv):
    """The -mca/-x settings and bare flags of an mpirun line, in a comparable form."""
    found, i = set(), 0
    while i < len(argv):
        if argv[i] == "-mca":
            found.add(("-mca", argv[i + 1], argv[i + 2]))
            i += 3
        elif argv[i] in ("-x", "-bind-to", "-map-by"):
            found.add((argv[i], argv[i + 1]))
            i += 2
        else:
            i += 1
    return found


def test_every_mpirun_gets_the_same_flags():
    argv = mpirun_argv("mpirun", HOSTS, np=4, user="root", ssh_ports={22}, network_interface="eth1")
    assert argv[:5] == ["mpirun", "-np", "4", "-H", "10.9.0.1:2,10.9.0.2:2"]
    assert argv[5:5 + len(MPIRUN_FLAGS)] == list(MPIRUN_FLAGS) and "--tag-output" in argv
    assert all(("-x", variable) in _flag_pairs(argv) for variable in MPIRUN_ENV)
    assert ("-mca", "btl_tcp_if_include", "eth1") in _flag_pairs(argv) and "--allow-run-as-root" in argv


def test_the_check_gate_runs_mpirun_as_jobs_do_but_untagged():
    gate = shlex.split(mpirun_command("/opt/mpi/bin/mpirun", HOSTS, "root", "eth1"))
    job = mpirun_argv("mpirun", HOSTS, np=4, user="root", ssh_ports={22}, network_interface="eth1")
    assert gate[:2] == ["timeout", "120"] and gate[-1] == "hostname"
    assert _flag_pairs(gate) == _flag_pairs(job)
    assert gate[gate.index("-H") + 1] == "10.9.0.1:1,10.9.0.2:1"  # one process per node
    assert "--tag-output" not in gate  # the gate compares the host names themselves


def test_the_ssh_port_is_named_only_when_it_is_not_22():
    assert ssh_port_option({22}) is None and ssh_port_option({2222}) == 2222
    argv = mpirun_argv("mpirun", HOSTS, np=2, user="ml", ssh_ports={2222}, network_interface=None)
    assert ("-mca", "plm_rsh_args", "-p 2222") in _flag_pairs(argv) and "--allow-run-as-root" not in argv


# --- the sweep after a job: no process of it left ---------------------------------------


def _start_job_process(job_dir: Path, ignore_term: bool) -> subprocess.Popen:
    code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "") + \
        "print('up', flush=True)\ntime.sleep(120)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(job_dir / "workloads" / "x.py")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"  # its SIGTERM handler is in place
    return proc


@pytest.mark.parametrize("ignore_term", [False, True])
def test_the_sweep_kills_what_ignores_sigterm_and_says_nothing_is_left(tmp_path, ignore_term):
    job_dir = tmp_path / "jobs" / "20261124-010000-42"
    proc = _start_job_process(job_dir, ignore_term)
    bystander = _start_job_process(tmp_path / "jobs" / "20261124-010000-421", ignore_term=False)
    try:
        # A grace of one tick (0.5 s) rather than the real 5 s: what ignores SIGTERM gets SIGKILL sooner.
        line = stray_sweep_line(PurePosixPath(job_dir)).replace("i -lt 10", "i -lt 1")
        sweep = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30)
        assert sweep.returncode == 0, sweep.stderr
        assert proc.wait(timeout=5) is not None
        assert bystander.poll() is None  # another job's folder is not this one's
    finally:
        for p in (proc, bystander):
            p.kill()
            p.wait()


def test_the_sweep_names_a_survivor_and_fails(tmp_path, monkeypatch):
    job_dir = tmp_path / "jobs" / "20261124-010000-43"
    proc = _start_job_process(job_dir, ignore_term=True)
    try:
        # A pkill that cannot kill (as for a process of another user): the survivor is listed, exit 3.
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "pkill").write_text("#!/bin/sh\nexit 0\n")
        (fake / "pkill").chmod(0o755)
        line = stray_sweep_line(PurePosixPath(job_dir)).replace("i -lt 10", "i -lt 1")
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
        sweep = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30, env=env)
        assert sweep.returncode == 3
        assert f"{proc.pid} " in sweep.stderr and str(job_dir) in sweep.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_work_folder_a_pattern_cannot_name_is_refused():
    with pytest.raises(BadInput, match="common_work_dir"):
        job_process_pattern(PurePosixPath("/srv/my jobs/1"))
    assert job_process_pattern(PurePosixPath("/srv/pycli/jobs/1.2")) == "[/]srv/pycli/jobs/1[.]2([/ ]|$)"


def test_the_node_paths_are_the_common_roles_defaults_unless_the_inventory_sets_them():
    import yaml

    from pycli.core.tree import PROJECT_ROOT
    from pycli.jobs.launch import NodeLayout

    role = yaml.safe_load((PROJECT_ROOT / "roles" / "common" / "defaults" / "main.yml").read_text())
    layout = NodeLayout()
    assert str(layout.venv) == role["common_venv_path"] and str(layout.work_dir) == role["common_work_dir"]
    assert NodeLayout.from_settings({}) == layout
    moved = NodeLayout.from_settings({"common_venv_path": "/opt/venv", "common_work_dir": "/data/pycli"})
    assert moved.python == "/opt/venv/bin/python" and moved.store == PurePosixPath("/data/pycli/files")


def _template(text: str, **variables) -> str:
    """`text` templated by Ansible with the common and horovod roles' defaults and `variables`."""
    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from pycli.core.tree import PROJECT_ROOT

    defaults = {}
    for role in ("common", "horovod"):
        found = yaml.safe_load((PROJECT_ROOT / "roles" / role / "defaults" / "main.yml").read_text())
        defaults.update({k: trust_as_template(v) if isinstance(v, str) else v for k, v in found.items()})
    return Templar(loader=DataLoader(), variables={**defaults, **variables}).template(trust_as_template(text))


def _common_task(name: str) -> dict:
    import yaml

    from pycli.core.tree import PROJECT_ROOT

    tasks = yaml.safe_load((PROJECT_ROOT / "roles" / "common" / "tasks" / "configure.yml").read_text())
    [task] = [task for task in tasks if task["name"] == name]
    return task


def test_the_horovod_role_installs_into_the_venv_the_common_role_recorded():
    run = _common_task("Record the shared environment's path for the later plays of this run")
    node = _common_task("Record the shared environment's path as a local fact")
    recorded = _template(run["ansible.builtin.set_fact"]["_common_venv_path"], common_venv_path="/opt/torch/.venv")
    written = json.loads(_template(node["ansible.builtin.copy"]["content"], common_venv_path="/opt/torch/.venv"))
    assert recorded == written["venv_path"] == "/opt/torch/.venv"
    # In the run the common role ran in, its record of the run; in another run, the node's.
    assert _template("{{ horovod_venv_path }}", _common_venv_path=recorded,
                     ansible_local={"common": {"venv_path": "/old/venv"}}) == "/opt/torch/.venv"
    assert _template("{{ horovod_venv_path }}", ansible_local={"common": written}) == "/opt/torch/.venv"
    assert _template("{{ horovod_venv_path }}") == ""  # the horovod role's preflight then stops


def test_the_venv_path_is_written_in_the_common_role_s_defaults_alone():
    from pycli.core.paths import role_defaults
    from pycli.core.tree import PROJECT_ROOT

    venv = role_defaults("common")["common_venv_path"]
    home = PROJECT_ROOT / "roles" / "common" / "defaults" / "main.yml"
    places = [*PROJECT_ROOT.glob("playbooks/*.yml"), *PROJECT_ROOT.glob("roles/*/*/*.yml"),
              *PROJECT_ROOT.glob("roles/*/templates/*.j2"), *PROJECT_ROOT.glob("pycli/**/*.py")]
    copies = [str(path.relative_to(PROJECT_ROOT)) for path in places if path != home and venv in path.read_text()]
    assert len(places) > 50 and not copies, copies


def test_gloo_and_nccl_sockets_follow_the_interface_in_every_line_that_names_one():
    from pycli.health.deep import pair_allreduce_command
    from pycli.jobs.launch import socket_interface_env

    assert socket_interface_env(None) == [] and socket_interface_env("") == []
    settings = socket_interface_env("ens5")
    assert sorted(settings) == ["GLOO_SOCKET_IFNAME=ens5", "NCCL_SOCKET_IFNAME=ens5"]
    mpirun = mpirun_argv("mpirun", HOSTS, np=4, user="me", ssh_ports={22}, network_interface="ens5")
    assert all(("-x", setting) in _flag_pairs(mpirun) for setting in settings)
    assert "env GLOO_SOCKET_IFNAME=ens5 NCCL_SOCKET_IFNAME=ens5 /v/bin/python" in pair_allreduce_command(
        "/v/bin/python", 0, "10.9.0.1", 29431, "ens5")
    assert "env /v/bin/python" in pair_allreduce_command("/v/bin/python", 0, "10.9.0.1", 29431, None)
