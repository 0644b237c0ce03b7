"""`pycli train --gpus-per-node`, `--account`, `--qos` and `--partition`: what Slurm is asked for,
what the ranks see over SSH, and the requests refused in one line. No SSH, no Slurm."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from pycli.cli.app import main
from pycli.cluster.model import Cluster, Host
from pycli.core.errors import BadInput
from pycli.cluster import slurm_nodes
from pycli.jobs import slurm
from pycli.jobs.launch import GPUS_VAR, HOROVOD_CPU_ENV, NodeLayout, gpus_short, launch_commands
from pycli.jobs.slurm_queue import batch_job
from pycli.jobs.train import JobRequest, plan_job
from tests.conftest import ROOT

DATA = ROOT / "tests" / "fixtures" / "recorded"


def _cluster(with_slurm: bool = True) -> Cluster:
    hosts = tuple(Host(name=f"n{i}", address=f"10.9.0.{i}", user="root", slots=2) for i in (1, 2))
    return Cluster(hosts=hosts, launcher="n1", slurm_controller="n1" if with_slurm else None)


def _plan(with_slurm: bool = True, **asked):
    request = JobRequest.of(**{"np": 4, "workload": "mnist", "data_dir": DATA, "scheduler": None, **asked})
    return plan_job(_cluster(with_slurm), request, layout=NodeLayout(), job_id="j1")


def _states(gpus: int) -> dict[str, slurm_nodes.NodeState]:
    gres = f"gpu:{gpus}" if gpus else "(null)"
    return slurm_nodes.parse_sinfo_nodes("".join(f"n{i}|idle|{gres}|none\n" for i in (1, 2)))


def _settings(plan) -> list[str]:
    """The NAME=VALUE words before horovodrun on the job's one launch line."""
    ((_, line),) = launch_commands(plan)
    argv = shlex.split(line.split(" && exec env ", 1)[1])
    return argv[:argv.index(NodeLayout().tool("horovodrun"))]


def test_through_slurm_the_job_asks_for_its_gpus_account_qos_and_partition_as_slurm_spells_them():
    plan = _plan(gpus_per_node=1, account="vision", qos="short", partition="gpu")
    script = slurm.sbatch_script(batch_job(plan, _states(2), time_limit_s=600))
    for option in ("--gres=gpu:1", "--account=vision", "--qos=short", "--partition=gpu", "--time=0:10:00"):
        assert f"#SBATCH {option}\n" in script
    # Asked for nothing: one GPU per rank where Slurm's Gres has them, and no queue options.
    plain = slurm.sbatch_script(batch_job(_plan(), _states(2), time_limit_s=None))
    assert "#SBATCH --gres=gpu:2\n" in plain and "--account" not in plain and "--qos" not in plain
    assert "--gres" not in slurm.sbatch_script(batch_job(_plan(), _states(0), time_limit_s=None))
    assert "--gres" not in slurm.sbatch_script(batch_job(_plan(gpus_per_node=0), _states(2), time_limit_s=None))
    # Slurm gives the job's GPUs out itself (CUDA_VISIBLE_DEVICES on each node): pycli does not.
    assert not any(word.startswith(f"{GPUS_VAR}=") for word in _settings(plan))


def test_more_gpus_than_a_node_has_is_one_line_naming_the_node():
    with pytest.raises(BadInput) as caught:
        batch_job(_plan(gpus_per_node=3), _states(2), time_limit_s=None)
    said = str(caught.value)
    assert said == "--gpus-per-node 3: more GPUs than a node of the job has (n1 has 2, n2 has 2, in Slurm's Gres)"
    assert gpus_short(1, [("n1", 1), ("n2", 0)], "as staging counted them") == (
        "--gpus-per-node 1: more GPUs than a node of the job has (n2 has 0, as staging counted them)")
    assert gpus_short(None, [("n1", 0)], "x") is None and gpus_short(2, [("n1", 2)], "x") is None


def test_over_ssh_the_ranks_see_the_first_n_gpus_of_each_node():
    staged = {"node_cpus": (("n1", 8), ("n2", 8)), "node_gpus": (("n1", 4), ("n2", 4))}
    two = replace(_plan(with_slurm=False, gpus_per_node=2), **staged)
    assert f"{GPUS_VAR}=0,1" in _settings(two)
    assert not any(setting in _settings(two) for setting in HOROVOD_CPU_ENV)
    # None: every GPU hidden, and Horovod's settings for CPUs, as on a node without GPUs.
    none = replace(_plan(with_slurm=False, gpus_per_node=0), **staged)
    assert f"{GPUS_VAR}=" in _settings(none) and all(setting in _settings(none) for setting in HOROVOD_CPU_ENV)
    # Not asked: the ranks see what the node has, as before.
    assert not any(word.startswith(f"{GPUS_VAR}=") for word in _settings(replace(_plan(with_slurm=False), **staged)))
    # The user's --env comes later and wins; mpirun hands the setting on to every rank.
    mine = replace(_plan(with_slurm=False, gpus_per_node=1, env=(f"{GPUS_VAR}=3",)), **staged)
    assert _settings(mine).index(f"{GPUS_VAR}=3") > _settings(mine).index(f"{GPUS_VAR}=0")
    ((_, line),) = launch_commands(replace(two, launcher="mpirun"))
    assert f"-x {GPUS_VAR}" in line


@pytest.mark.parametrize(("asked", "slurm_there", "message"), [
    ({"gpus_per_node": -1}, True, "--gpus-per-node -1: give the GPUs the job gets on each node, 0 or more"),
    ({"account": "vision"}, False, "--account vision: Slurm's, and this job starts over SSH, outside any queue; "
                                   "drop it or run the job through Slurm (--scheduler slurm)"),
    ({"qos": "short", "partition": "gpu", "scheduler": "ssh"}, True,
     "--qos short --partition gpu: Slurm's, and this job starts over SSH, outside any queue; drop them"),
    ({"account": "a b"}, True, "--account 'a b': give a Slurm account name (letters, digits, '_', '.', '-')"),
    ({"partition": "gpu,cpu"}, True, "--partition 'gpu,cpu': give a Slurm partition name"),
    ({"qos": "-x"}, True, "--qos '-x': give a Slurm QOS name"),
])
def test_requests_slurm_cannot_take_are_refused_before_anything_runs(asked, slurm_there, message):
    with pytest.raises(BadInput) as caught:
        _plan(with_slurm=slurm_there, **asked)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_the_cli_passes_the_flags_on_and_says_a_refusal_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "cache"))
    inventory = tmp_path / "a.ini"
    inventory.write_text("[nodes]\nn1 ansible_host=10.0.0.1 slots=2\nn2 ansible_host=10.0.0.2 slots=2\n")
    assert main(["train", "--np", "2", "-i", str(inventory), "--partition", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycli: error: --partition gpu: Slurm's, and this job starts over SSH") and err.count("\n") == 1
    assert main(["train", "--np", "2", "-i", str(inventory), "--gpus-per-node", "-2"]) == 2
    assert capsys.readouterr().err == "pycli: error: --gpus-per-node -2: give the GPUs the job gets on each node, 0 or more\n"


def test_through_slurm_torchrun_meets_on_the_first_node_at_a_port_the_script_picks_as_the_job_starts():
    job = batch_job(_plan(workload="ddp"), _states(0), time_limit_s=None)
    assert job.job_id_env == "PET_RDZV_ID" and job.rendezvous_env == ("PET_RDZV_ENDPOINT", "10.9.0.1")
    assert "export PET_RDZV_ENDPOINT=10.9.0.1:\"$((20000 + SLURM_JOB_ID % 5000))\"\n" in slurm.sbatch_script(job)
    assert batch_job(_plan(), _states(0), time_limit_s=None).rendezvous_env == ()


def test_through_slurm_a_docker_job_s_containers_get_an_ssh_port_of_its_own_unless_one_is_named():
    from pycli.jobs import containers

    own = batch_job(_plan(container=containers.JobContainer("img")), _states(0), time_limit_s=None)
    assert own.ssh_port_env == "PYCLI_JOB_SSH_PORT"
    assert 'export PYCLI_JOB_SSH_PORT="$((25000 + SLURM_JOB_ID % 5000))"\n' in slurm.sbatch_script(own)
    assert batch_job(_plan(container=containers.JobContainer("img", ssh_port=2200)), _states(0),
                     time_limit_s=None).ssh_port_env == ""
    assert batch_job(_plan(), _states(0), time_limit_s=None).ssh_port_env == ""
