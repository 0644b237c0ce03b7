"""--elastic: horovodrun's elastic mode and its host discovery script, torchrun's agents and c10d, what it refuses."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from pycli.core.errors import BadInput
from pycli.jobs.containers import JobContainer
from pycli.jobs.files import stage_items
from pycli.jobs.launch import elastic_min_nodes, host_discovery_script, launch_commands, torchrun_argv, workload_args
from tests.unit.jobs.test_train_plan import cluster, only_line, plan


def test_elastic_horovodrun_finds_its_hosts_by_the_script_and_the_workload_goes_elastic():
    job = plan(np=4, elastic=True, min_np=2)
    _, argv = only_line(job)
    assert "-H" not in argv  # horovodrun takes the hosts from the script, again and again
    assert argv[argv.index("--min-np") + 1] == "2" and argv[argv.index("--max-np") + 1] == "4"
    assert argv[argv.index("--host-discovery-script") + 1] == "/srv/pycli/jobs/j1/discover-hosts.sh"
    assert "--gloo" in argv and "--elastic" in workload_args(job)
    assert plan(np=4, elastic=True).elastic_min_np == 4  # without --min-np it waits for every rank
    assert "--elastic" not in workload_args(plan(np=4))


def test_an_elastic_horovodrun_job_on_one_node_is_given_the_loopback_interface():
    """Both ranks on n1 (four slots): without an interface, elastic horovodrun compares two hosts to
    find one and waits its 600 s for a second; on one node the one to use is the loopback's."""
    from dataclasses import replace as replaced

    one_node = plan(cluster(slots=(4, 4)), np=2, elastic=True, min_np=1)
    assert [h.name for h in one_node.hosts] == ["n1"]
    for job in (one_node, replaced(one_node, network_interface="eth0")):
        _, argv = only_line(job)
        assert argv[argv.index("--network-interface") + 1] == "lo"
    _, argv = only_line(plan(cluster(slots=(4, 4)), np=2))  # static: horovodrun finds it by itself
    assert "--network-interface" not in argv
    _, argv = only_line(replaced(plan(np=4, elastic=True, min_np=1), network_interface="eth0"))  # two nodes
    assert argv[argv.index("--network-interface") + 1] == "eth0"


def test_the_discovery_script_is_staged_beside_the_job(tmp_path):
    job = plan(np=4, elastic=True, min_np=1)
    script = tmp_path / "discover-hosts.sh"
    script.write_text("#!/bin/bash\n")
    item = stage_items(job, None, script)[-1]
    assert (item.src, item.how, str(item.dest)) == (script.resolve(), "direct", "/srv/pycli/jobs/j1/discover-hosts.sh")


def _fake_ssh(folder: Path, answering: set[str]) -> dict[str, str]:
    """An `ssh` that answers for some addresses and times out for the others, logging its arguments."""
    folder.mkdir()
    (folder / "ssh").write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {folder}/calls\n'
        'host=${@: -2:1}\n'
        f'case " {" ".join(sorted(answering))} " in *" $host "*) exit 0 ;; esac\n'
        "sleep 0.3; echo 'ssh: connect to host: Connection timed out' >&2; exit 255\n"
    )
    (folder / "ssh").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.parametrize(("answering", "expected"), [
    ({"10.9.0.1", "10.9.0.2", "10.9.0.3"}, "10.9.0.1:2\n10.9.0.2:1\n10.9.0.3:2\n"),
    ({"10.9.0.1", "10.9.0.3"}, "10.9.0.1:2\n10.9.0.3:2\n"),  # a lost node drops out, the order stays
    (set(), ""),
])
def test_the_discovery_script_names_the_hosts_that_answer_now_with_their_slots(tmp_path, answering, expected):
    job = plan(cluster(slots=(2, 1, 2)), np=5, elastic=True, min_np=1)
    script = tmp_path / "discover-hosts.sh"
    script.write_text(host_discovery_script(job))
    env = _fake_ssh(tmp_path / "bin", answering)
    done = subprocess.run([str(script)] if os.access(script, os.X_OK) else ["bash", str(script)],
                          capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0 and done.stdout == expected, done.stderr
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert len(calls) == 3 and all("-o BatchMode=yes" in c and "-o ConnectTimeout=3" in c for c in calls)


def test_the_discovery_script_keeps_every_address_one_word(tmp_path):
    job = plan(np=4, elastic=True, min_np=1)
    hostile = type(job.hosts[0])(name="n1", address="10.9.0.1;touch${IFS}pwned", user="root", slots=2)
    text = host_discovery_script(type(job)(**{**job.__dict__, "hosts": (hostile,)}))
    env = _fake_ssh(tmp_path / "bin", set())
    subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("kw", "message"), [
    ({"launcher": "mpirun"}, "--elastic is horovodrun's elastic mode (with its gloo controller) or torchrun's"),
    ({"controller": "mpi"}, "--elastic is horovodrun's elastic mode (with its gloo controller) or torchrun's"),
    ({"workload": "synthetic"}, "--elastic works with the mnist and ddp workloads or a script that keeps its state"),
    ({"container": JobContainer(image="img")}, "--elastic does not work with --docker yet"),
    ({"min_np": 5}, "--min-np 5: give a number of ranks from 1 to --np 4"),
])
def test_elastic_options_that_cannot_work_are_one_line(kw, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        plan(np=4, elastic=True, **kw)


def test_elastic_torchrun_meets_by_c10d_on_the_first_node_and_its_agents_restart():
    job = plan(cluster(slots=(2, 2, 2)), np=6, workload="ddp", elastic=True, min_np=3, elastic_restarts=2)
    assert job.restarts_by_agents
    argv = torchrun_argv(job, 1)
    option = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert option("--nnodes") == "2:3"  # 3 ranks need 2 of the nodes of 2 slots
    assert option("--max-restarts") == "2" and option("--rdzv-backend") == "c10d"
    assert option("--rdzv-endpoint") == f"{job.hosts[0].address}:29400"
    assert option("--local-addr") == job.hosts[1].address  # the node's inventory address, also in the rank order
    assert "--node-rank" not in argv and "--master-addr" not in argv  # the rendezvous numbers the nodes
    assert "--elastic" in workload_args(job) and argv.count("--rdzv-id") == 1
    lines = launch_commands(job)
    assert len(lines) == 3 and all("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line for _, line in lines)  # one agent per node
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in launch_commands(plan(np=4, workload="ddp"))[0][1]
    assert plan(np=4, workload="ddp", elastic=True).elastic_restarts == 3  # the default without --elastic-restarts
    assert plan(np=4, workload="ddp", elastic=True, elastic_restarts=0).elastic_restarts == 0
    assert not plan(np=4, workload="ddp", max_restarts=1).restarts_by_agents


@pytest.mark.parametrize(("slots", "min_np", "nodes"), [
    ((2, 2, 2), 1, 1), ((2, 2, 2), 6, 3), ((4, 1, 1), 2, 2), ((4, 1, 1), 5, 3), ((4, 1, 1), 6, 3), ((3,), 9, 1),
])
def test_elastic_torchrun_counts_the_nodes_that_hold_min_np_whichever_are_left(slots, min_np, nodes):
    hosts = cluster(slots=slots).hosts
    assert elastic_min_nodes(hosts, min_np) == nodes


def test_max_restarts_is_pycli_s_and_elastic_restarts_torchrun_s(capsys):
    """One meaning per flag: --max-restarts is pycli's restarts, --elastic-restarts the agents'."""
    horovod = plan(np=4, elastic=True, max_restarts=2)  # horovodrun --elastic: pycli restarts it on top
    assert horovod.request.recovery.max_restarts == 2 and horovod.elastic_restarts == 0 and not horovod.restarts_by_agents
    with pytest.raises(BadInput, match=r"^--elastic-restarts is how often torchrun's agents .* runs under horovod: "):
        plan(np=4, elastic=True, elastic_restarts=2)
    with pytest.raises(BadInput, match=r"this job runs under torchrun without --elastic: pycli's own restarts are --max-restarts$"):
        plan(np=4, workload="ddp", elastic_restarts=2)
    with pytest.raises(BadInput, match=r"^--elastic-restarts -1: give how often"):
        plan(np=4, workload="ddp", elastic=True, elastic_restarts=-1)
    with pytest.raises(BadInput, match=r"pycli does not start the job again on top; leave out --max-restarts$"):
        plan(np=4, workload="ddp", elastic=True, elastic_restarts=1, max_restarts=1)
    assert capsys.readouterr().err == ""


def test_max_restarts_with_elastic_torchrun_still_means_the_agents_for_one_release(capsys):
    job = plan(np=4, workload="ddp", elastic=True, max_restarts=2)
    assert job.elastic_restarts == 2 and job.request.recovery.max_restarts == 0 and job.restarts_by_agents
    err = capsys.readouterr().err
    assert err == ("pycli: train --max-restarts with --elastic under torchrun is now --elastic-restarts (its agents' "
                   "restarts); the old name goes after release 0.3.0 (CHANGELOG.md)\n")
