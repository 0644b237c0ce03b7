"""pycli_node.node_gate, as Slurm runs it on a node: real processes, stand-in tools where this machine
has none (nvidia-smi printing a real machine's recorded output, scontrol and munge writing down
what they were asked)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycli.core.paths import NODE_PACKAGE
from pycli_node import node_gate
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "recorded"
PROJECT = ROOT


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's tools: scontrol answers from state.txt and logs its updates; munge works."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "state.txt"
    state.write_text("NodeName=node2 Arch=x86_64 State=IDLE ThreadsPerCore=1 Reason=\n")
    log = tmp_path / "scontrol.log"
    _tool(bin_dir, "scontrol", f'if [ "$1" = show ]; then cat {state}; else echo "$@" >> {log}; fi\n')
    _tool(bin_dir, "munge", "echo credential\n")
    _tool(bin_dir, "unmunge", "cat >/dev/null; echo STATUS: Success\n")
    _tool(bin_dir, "sudo", "exit 1\n")
    _tool(bin_dir, "journalctl", "echo 'kernel: nothing to see'\n")
    _tool(bin_dir, "docker", "exit 0\n")  # no container of any job
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir, state, log


def _updates(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_healthy_node_without_gpus_passes_and_nothing_changes(node, capsys):
    _, _, log = node
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 0
    assert capsys.readouterr().out.startswith("pycli health: healthy")
    assert _updates(log) == []


def test_a_pending_row_remap_drains_the_node_with_the_gates_reason(node, capsys):
    bin_dir, state, log = node
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 1
    [update] = _updates(log)
    assert update.startswith("update nodename=node2 state=drain reason=pycli health: GPU 0")
    assert "a row remap is pending" in update
    # Drained already with that reason: not asked again at the next interval.
    state.write_text(f"NodeName=node2 State=IDLE+DRAIN Reason={update.split('reason=', 1)[1]} [root@2026-11-26T10:00:00]\n")
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 1
    assert len(_updates(log)) == 1
    # Repaired: the gate resumes what it drained.
    (bin_dir / "nvidia-smi").unlink()
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 0
    assert _updates(log)[-1] == "update nodename=node2 state=resume"


def test_a_person_s_drain_keeps_its_reason_through_a_failed_check_and_stays_after_a_passed_one(node, capsys):
    """`pycli drain node2 --reason "DIMM replacement"`, then the node fails its health check and
    passes it again: the reason is the person's all along, and the node stays drained."""
    bin_dir, state, log = node
    state.write_text("NodeName=node2 State=IDLE+DRAIN Reason=DIMM replacement [root@2026-11-28T10:00:00]\n")
    _tool(bin_dir, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9\n")
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 1
    assert "drained already: DIMM replacement; left so" in capsys.readouterr().out
    (bin_dir / "nvidia-smi").unlink()
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 0
    assert _updates(log) == []


def test_a_drain_for_any_other_reason_stays(node):
    _, state, log = node
    state.write_text("NodeName=node2 State=IDLE+DRAIN Reason=pycli: fenced by check --deep [root@2026-11-26T10:00:00]\n")
    assert node_gate.health("node2", ["/"], 0.001, probe_timeout_s=60) == 0
    assert _updates(log) == []


def test_disk_space_and_munge_are_part_of_the_health_check(node, tmp_path):
    bin_dir, _, log = node
    _tool(bin_dir, "unmunge", "cat >/dev/null; echo 'unmunge: Error: Invalid credential' >&2; exit 1\n")
    assert node_gate.health("node2", ["/", str(tmp_path / "missing")], 10**9, probe_timeout_s=60) == 1
    [update] = _updates(log)
    assert "/: " in update and "GiB free, below 1e+09 GiB" in update
    assert "missing: No such file or directory" in update
    assert "munge does not work: unmunge: Error: Invalid cred" in update



def test_the_probe_gets_the_time_the_wrappers_pass_and_the_command_asks_for_it():
    """The probe's time is the slurm role's slurm_prolog_timeout, passed by its wrappers: the gate
    has no number of its own."""
    given = []

    def run(command: str, timeout_s: float) -> tuple[int, str]:
        given.append((command.split()[0], timeout_s))
        return 0, "NodeName=node2 State=IDLE Reason=" if command.startswith("scontrol") else ""

    assert node_gate.prolog("node2", probe_timeout_s=17, run=run) == 0
    assert node_gate.health("node2", [], 0, probe_timeout_s=23, run=run) == 0
    probes = [timeout for command, timeout in given if not command.startswith(("scontrol", "munge"))]
    assert probes == [17, 23]
    for mode in ("health", "prolog"):
        ran = subprocess.run([sys.executable, "-S", "-m", "pycli_node.node_gate", mode, "--node", "node2"],
                             cwd=NODE_PACKAGE.parent, capture_output=True, text=True, timeout=30)
        assert ran.returncode == 2 and f"{mode} needs --probe-timeout S" in ran.stderr, ran.stderr

def test_the_prolog_fails_on_a_sick_gpu_and_passes_without_one(node):
    bin_dir, _, log = node
    assert node_gate.prolog("node2", probe_timeout_s=60) == 0
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    assert node_gate.prolog("node2", probe_timeout_s=60) == 1
    assert _updates(log)[0].startswith("update nodename=node2 state=drain reason=pycli prolog: GPU 0")


def test_a_reason_is_one_line_of_at_most_200_characters():
    said = node_gate.reason(node_gate.HEALTH_PREFIX, ["a\nb", "x" * 300])
    assert said.startswith("pycli health: a b; xxx") and len(said) == 200 and said.endswith("...")


def test_the_epilog_stops_what_the_job_left_and_spares_the_rest(node, tmp_path):
    _, _, log = node
    job = str(900000 + os.getpid() % 10000)
    env = {**os.environ, "SLURM_JOB_ID": job}
    left = subprocess.Popen(["sleep", "300"], env=env)
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 0.1; done"], env=env)
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, "SLURM_JOB_ID": job + "1"})
    try:
        time.sleep(0.3)
        ran = subprocess.run([sys.executable, "-m", "pycli_node.node_gate", "epilog", "--node", "node2"], env=env,
                             cwd=PROJECT, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert left.wait(5) == -15 and stubborn.wait(5) == -9
        assert other.poll() is None
        assert _updates(log) == []
    finally:
        for proc in (left, stubborn, other):
            proc.kill()
            proc.wait()


def test_the_epilog_removes_the_jobs_containers_with_their_keys_and_drains_where_one_stays(node, tmp_path, capsys):
    bin_dir, _, log = node
    job_dir = tmp_path / "job"
    (job_dir / "container").mkdir(parents=True)
    for name in ("ssh_host_ed25519_key", "id_ed25519", "known_hosts"):
        (job_dir / "container" / name).write_text("x\n")
    asked = tmp_path / "docker.log"
    # Job 42 has two containers; `docker rm` answers $RM_SAYS and exits $RM_CODE.
    _tool(bin_dir, "docker", f'echo "$*" >> {asked}\n'
          'case "$1" in\n'
          f'  ps) if [ "$4" = "label={node_gate.SLURM_JOB_LABEL}=42" ]; then printf "c1\\nc2\\n"; fi ;;\n'
          f'  inspect) echo {job_dir}; echo {job_dir} ;;\n'
          '  rm) echo "${RM_SAYS:-c1 c2}"; exit "${RM_CODE:-0}" ;;\n'
          'esac\n')
    assert node_gate.epilog("node2", "41", wait_s=0.1) == 0  # another job's: nothing removed
    assert asked.read_text().splitlines() == [f"ps -aq --filter label={node_gate.SLURM_JOB_LABEL}=41"]
    assert node_gate.epilog("node2", "42", wait_s=0.1) == 0
    assert asked.read_text().splitlines()[-1] == "rm -f c1 c2"
    assert sorted(p.name for p in (job_dir / "container").iterdir()) == ["known_hosts"]
    assert _updates(log) == []
    # A container Docker will not remove: the node is drained, as for a process that survives.
    os.environ["RM_SAYS"], os.environ["RM_CODE"] = "Error response from daemon: device or resource busy", "1"
    try:
        assert node_gate.epilog("node2", "42", wait_s=0.1) == 1
    finally:
        del os.environ["RM_SAYS"], os.environ["RM_CODE"]
    [update] = _updates(log)
    assert update.startswith("update nodename=node2 state=drain reason=pycli epilog: container(s) of job 42 not removed: "
                             "Error response from daemon"), update


def test_the_epilog_follows_no_link_the_job_put_in_its_folder(node, tmp_path):
    bin_dir, _, _ = node
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "id_ed25519").write_text("someone else's key\n")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "container").symlink_to(elsewhere)  # the job controls its folder
    _tool(bin_dir, "docker", 'case "$1" in\n'
          '  ps) echo c1 ;;\n'
          f'  inspect) echo {job_dir} ;;\n'
          'esac\n')
    assert node_gate.epilog("node2", "42", wait_s=0.1) == 0
    assert (elsewhere / "id_ed25519").read_text() == "someone else's key\n"


def test_the_epilog_drains_where_docker_does_not_answer_as_it_may_keep_the_job_s_containers(node, tmp_path):
    bin_dir, _, log = node
    _tool(bin_dir, "docker", 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."; exit 1\n')
    assert node_gate.epilog("node2", "42", wait_s=0.1) == 1
    [update] = _updates(log)
    assert update.startswith("update nodename=node2 state=drain reason=pycli epilog: cannot list the containers of job "
                             "42 (docker ps: Cannot connect to the Docker daemon"), update
    # A dockerd that hangs: docker ps times out, and the node is drained the same way.
    answers = iter([(124, "timed out after 30 s")])
    assert node_gate.epilog("node2", "43", run=lambda command, timeout_s: next(answers, (0, "")), wait_s=0.1) == 1


def test_the_epilog_needs_the_job_id(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert node_gate.main(["epilog", "--node", "node2"]) == 2
    assert "no SLURM_JOB_ID" in capsys.readouterr().err


def test_the_node_package_runs_from_what_its_role_installs_alone(tmp_path):
    """What role pycli_node copies to a node (the package's modules) is all the node needs: each
    module imports with the standard library alone (`-S`: no site-packages, no pycli), and the gate
    runs as Slurm's commands run it."""
    package = tmp_path / "pycli_node"
    package.mkdir()
    modules = sorted(NODE_PACKAGE.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "gpu_reports.py", "gpu_probe.py", "node_gate.py"}
    for module in modules:
        (package / module.name).write_text(module.read_text())
    for module in modules:
        name = "pycli_node" if module.stem == "__init__" else f"pycli_node.{module.stem}"
        ran = subprocess.run([sys.executable, "-S", "-c", f"import {name}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0, (name, ran.stderr)
    ran = subprocess.run([sys.executable, "-S", "-m", "pycli_node.node_gate", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert "health" in ran.stdout


def test_a_third_party_import_in_the_node_package_fails_there(tmp_path):
    """The check above can fail: a module that needs anything beyond the standard library does."""
    package = tmp_path / "pycli_node"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bad.py").write_text("import yaml\n")
    ran = subprocess.run([sys.executable, "-S", "-c", "import pycli_node.bad"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode != 0 and "yaml" in ran.stderr


# dcgm-exporter's job mapping (--hpc-job-mapping-dir): one file per GPU index, one job id a line.

def _mapping(directory: Path) -> dict[str, list[str]]:
    return {path.name: path.read_text().splitlines() for path in sorted(directory.iterdir())
            if path.name.isdigit()}


def test_the_prolog_maps_the_jobs_gpus_and_the_epilog_takes_the_job_out(node, tmp_path):
    mapping = tmp_path / "run" / "dcgm-job-mapping"  # missing: the prolog makes it
    env = {"SLURM_JOB_GPUS": "0,2"}
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="41", mapping_dir=str(mapping), environ=env) == 0
    assert _mapping(mapping) == {"0": ["41"], "2": ["41"]}
    # A second job shares GPU 2 (a GPU shared by jobs, e.g. Slurm's sharding): one id a line.
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="42", mapping_dir=str(mapping), environ={"SLURM_JOB_GPUS": "2-3"}) == 0
    assert _mapping(mapping) == {"0": ["41"], "2": ["41", "42"], "3": ["42"]}
    # The same prolog again (Slurm retries): nothing twice.
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="42", mapping_dir=str(mapping), environ={"SLURM_JOB_GPUS": "2-3"}) == 0
    assert _mapping(mapping)["2"] == ["41", "42"]
    # The epilog needs no GPU list; a GPU left without jobs loses its file, so the exporter
    # reports it without hpc_job (an empty file would hide its series).
    assert node_gate.epilog("node2", "41", wait_s=0.1, mapping_dir=str(mapping)) == 0
    assert _mapping(mapping) == {"2": ["42"], "3": ["42"]}
    assert node_gate.epilog("node2", "42", wait_s=0.1, mapping_dir=str(mapping)) == 0
    assert _mapping(mapping) == {}
    # Only the lock is left: no temporary file, nothing the exporter would read as a GPU.
    assert [path.name for path in mapping.iterdir()] == [node_gate.MAPPING_LOCK]


def test_cuda_visible_devices_is_the_fallback_and_a_job_without_gpus_maps_nothing(node, tmp_path):
    mapping = tmp_path / "mapping"
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="7", mapping_dir=str(mapping), environ={"CUDA_VISIBLE_DEVICES": "1"}) == 0
    assert _mapping(mapping) == {"1": ["7"]}
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="8", mapping_dir=str(mapping), environ={}) == 0
    assert _mapping(mapping) == {"1": ["7"]}


def test_a_mapping_that_cannot_be_written_is_said_and_never_fails_the_prolog(node, tmp_path, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="9", mapping_dir=str(blocked / "mapping"), environ={"SLURM_JOB_GPUS": "0"}) == 0
    said = capsys.readouterr().err
    assert said.startswith("pycli prolog: dcgm-exporter job mapping not written in ")
    assert "Not a directory" in said and "\n" == said[-1] and said.count("\n") == 1
    # GPU ids Slurm did not give as indexes (UUIDs): said, the job runs.
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="9", mapping_dir=str(tmp_path / "m"),
                            environ={"CUDA_VISIBLE_DEVICES": "GPU-8f3c"}) == 0
    assert "CUDA_VISIBLE_DEVICES='GPU-8f3c' is not a list of GPU indexes" in capsys.readouterr().err
    # The epilog with a mapping folder it cannot read: said, the epilog's answer unchanged.
    assert node_gate.epilog("node2", "9", wait_s=0.1, mapping_dir=str(blocked)) == 0


def test_a_sick_gpu_drains_before_any_mapping_is_written(node, tmp_path):
    bin_dir, _, _ = node
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    mapping = tmp_path / "mapping"
    assert node_gate.prolog("node2", probe_timeout_s=60, job_id="5", mapping_dir=str(mapping), environ={"SLURM_JOB_GPUS": "0"}) == 1
    assert not mapping.exists()


def test_slurm_gpu_lists_are_read_as_indexes():
    assert node_gate.parse_gpu_ids("0,2,4-6") == ["0", "2", "4", "5", "6"]
    assert node_gate.parse_gpu_ids("3") == ["3"]
    assert node_gate.parse_gpu_ids("1,1") == ["1"]
    with pytest.raises(ValueError):
        node_gate.parse_gpu_ids("0,gpu1")


def test_the_prolog_and_epilog_commands_keep_the_mapping_as_slurm_runs_them(node, tmp_path):
    """Through `python3 -m pycli_node.node_gate` with Slurm's environment, as the role's wrappers run it."""
    mapping = tmp_path / "mapping"
    base = {**os.environ, "SLURM_JOB_ID": "123", "SLURM_JOB_GPUS": "1"}
    ran = subprocess.run([sys.executable, "-m", "pycli_node.node_gate", "prolog", "--probe-timeout", "60",
                          "--node", "node2", "--job-mapping-dir", str(mapping)], env=base, cwd=PROJECT, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert _mapping(mapping) == {"1": ["123"]}
    ran = subprocess.run([sys.executable, "-m", "pycli_node.node_gate", "epilog", "--node", "node2",
                          "--job-mapping-dir", str(mapping)], env=base, cwd=PROJECT, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert _mapping(mapping) == {}


def test_jobs_starting_at_once_all_land_in_the_shared_gpus_file(tmp_path):
    """Prologs of jobs that start together read and rewrite the same file: the lock keeps every id."""
    mapping = tmp_path / "mapping"
    code = ("import sys; from pycli_node import node_gate; "
            "[node_gate.map_job(sys.argv[1], f'{sys.argv[2]}{i}', ['0', '1']) for i in range(20)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(mapping), f"{n}00"], cwd=PROJECT) for n in range(1, 7)]
    assert [proc.wait(60) for proc in procs] == [0] * 6
    wanted = sorted(f"{n}00{i}" for n in range(1, 7) for i in range(20))
    assert sorted(_mapping(mapping)["0"]) == wanted
    assert sorted(_mapping(mapping)["1"]) == wanted
