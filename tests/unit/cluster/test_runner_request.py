"""The pure half of the ansible-runner adapter: requests in, runner arguments and results out."""

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from pycli.cluster.runner import HostResult, RunRequest, collect_host_event
from pycli.core.errors import BadInput
from pycli.core.tree import PROJECT_ROOT


def test_adhoc_request_names_module_pattern_and_project_config(tmp_path):
    kwargs = RunRequest(inventory=tmp_path / "hosts.ini", pattern="nodes", module="ping").runner_kwargs(tmp_path / "run")
    assert kwargs["private_data_dir"] == str(tmp_path / "run")
    assert kwargs["module"] == "ping" and kwargs["host_pattern"] == "nodes"
    assert kwargs["inventory"] == str((tmp_path / "hosts.ini").resolve())
    assert kwargs["envvars"]["ANSIBLE_CONFIG"] == str(PROJECT_ROOT / "ansible.cfg")
    assert kwargs["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "playbook" not in kwargs and "cmdline" not in kwargs


def test_playbook_request_carries_limit_tags_check_and_vars(tmp_path):
    request = RunRequest(
        inventory=tmp_path / "hosts.ini", playbook=Path("playbooks/site.yml"),
        limit="node1", tags="openmpi,horovod", skip_tags="docker", check=True, forks=10, extravars={"a": 1},
    )
    kwargs = request.runner_kwargs(tmp_path / "run", extravars_file=tmp_path / "vars.json")
    assert kwargs["playbook"].endswith("playbooks/site.yml")
    assert kwargs["limit"] == "node1" and kwargs["forks"] == 10
    assert kwargs["cmdline"] == f"-e @{tmp_path / 'vars.json'} --check --tags openmpi,horovod --skip-tags docker"


def test_cmdline_is_quoted_so_ansible_runner_splits_it_back_as_built(tmp_path):
    request = RunRequest(inventory=tmp_path / "hosts.ini", playbook=Path("site.yml"), tags="it's", skip_tags="a b")
    cmdline = request.runner_kwargs(tmp_path / "run")["cmdline"]
    assert shlex.split(cmdline) == ["--tags", "it's", "--skip-tags", "a b"]


def test_request_needs_exactly_one_of_module_and_playbook(tmp_path):
    with pytest.raises(ValueError):
        RunRequest(inventory=tmp_path).runner_kwargs(tmp_path)
    with pytest.raises(ValueError):
        RunRequest(inventory=tmp_path, module="ping", playbook=Path("x.yml")).runner_kwargs(tmp_path)


def _event(kind, host, **data):
    return {"event": kind, "event_data": {"host": host, "task": "install openmpi", **data}}


def test_events_fold_into_per_host_counts_and_messages():
    hosts: dict[str, HostResult] = {}
    collect_host_event(hosts, _event("runner_on_ok", "n1", res={"changed": True}))
    collect_host_event(hosts, _event("runner_on_ok", "n1", res={"changed": False}))
    collect_host_event(hosts, _event("runner_on_skipped", "n1"))
    collect_host_event(hosts, _event("runner_on_failed", "n2", res={"msg": "make failed\nmore"}))
    collect_host_event(hosts, _event("runner_on_failed", "n2", res={"msg": "tolerated"}, ignore_errors=True))
    collect_host_event(hosts, _event("runner_on_unreachable", "n3", res={"msg": "ssh: connect refused"}))
    collect_host_event(hosts, {"event": "playbook_on_start", "event_data": {}})
    assert (hosts["n1"].ok, hosts["n1"].changed, hosts["n1"].skipped) == (2, 1, 1)
    assert hosts["n2"].failed == 1 and hosts["n2"].messages == ["install openmpi: make failed"]
    assert hosts["n3"].unreachable and "connect refused" in hosts["n3"].messages[0]


def test_a_failure_a_rescue_took_up_is_no_failure_once_the_stats_say_so():
    """A block's rescue (the package cache's fall-back to the repositories) recovers the host."""
    hosts: dict[str, HostResult] = {}
    for host in ("n1", "n2"):
        collect_host_event(hosts, _event("runner_on_failed", host, res={"msg": "Timeout when waiting for 10.0.0.1:3142"}))
    collect_host_event(hosts, _event("runner_on_failed", "n2", res={"msg": "a later failure"}))
    collect_host_event(hosts, {"event": "playbook_on_stats",
                               "event_data": {"rescued": {"n1": 1, "n2": 1}, "failures": {"n2": 1}}})
    assert hosts["n1"].failed == 0 and hosts["n2"].failed == 1


def test_a_failed_command_is_told_by_its_stderr_and_a_failed_loop_by_its_failed_item():
    hosts: dict[str, HostResult] = {}
    collect_host_event(hosts, _event("runner_on_failed", "n1", res={
        "msg": "non-zero return code", "rc": 125, "stderr": "Unable to find image\ndocker: no such image: x:1.\n"}))
    collect_host_event(hosts, _event("runner_on_failed", "n2", res={
        "msg": "One or more items failed",
        "results": [{"failed": False, "msg": "ok"}, {"failed": True, "msg": "Could not find or access 'x.py'"}]}))
    assert hosts["n1"].messages == ["install openmpi: docker: no such image: x:1."]
    assert hosts["n2"].messages == ["install openmpi: Could not find or access 'x.py'"]


# Forks: --forks, else ANSIBLE_FORKS, else one per targeted host up to FORKS_PER_CORE a core.

@pytest.mark.parametrize(("hosts", "cores", "forks"), [
    (0, 2, 5), (1, 2, 5), (2, 16, 5),          # few hosts: Ansible's own default is the floor
    (8, 2, 8), (50, 2, 50),                    # every host at once while the cores keep up
    (51, 2, 50), (512, 2, 50), (512, 4, 100),  # many hosts: 25 a core
    (512, 64, 512), (2000, 64, 1600),
    (40, None, 25),                            # os.cpu_count() unknown: one core
])
def test_default_forks_follow_the_hosts_up_to_25_a_core_and_at_least_5(hosts, cores, forks):
    from pycli.cluster.runner import default_forks

    assert default_forks(hosts, cores) == forks


def _nodes_inventory(tmp_path, count):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[nodes]\n" + "".join(f"n{i} ansible_host=10.0.0.{i}\n" for i in range(1, count + 1)))
    return inventory


def test_forks_count_the_hosts_the_pattern_and_limit_leave(tmp_path):
    from pycli.cluster.runner import forks_for

    inventory = _nodes_inventory(tmp_path, 120)
    playbook = RunRequest(inventory=inventory, playbook=Path("site.yml"))
    assert forks_for(playbook, environ={}, cores=2) == 50
    assert forks_for(playbook, environ={}, cores=8) == 120
    assert forks_for(replace(playbook, limit="n1*"), environ={}, cores=8) == 32  # n1, n10-n19, n100-n120
    adhoc = RunRequest(inventory=inventory, pattern="n1,n2,n3,n4,n5,n6,n7", module="ping")
    assert forks_for(adhoc, environ={}, cores=1) == 7


def test_forks_given_or_ansible_forks_win_over_the_computed_number(tmp_path):
    from pycli.cluster.runner import forks_for

    request = RunRequest(inventory=_nodes_inventory(tmp_path, 120), playbook=Path("site.yml"))
    assert forks_for(replace(request, forks=3), environ={"ANSIBLE_FORKS": "7"}, cores=2) == 3
    assert forks_for(request, environ={"ANSIBLE_FORKS": "7"}, cores=2) is None  # Ansible reads it itself
    assert request.runner_kwargs(tmp_path / "run").get("forks") is None
    assert replace(request, forks=3).runner_kwargs(tmp_path / "run")["forks"] == 3


@pytest.mark.parametrize(("forks", "environ", "message"), [
    (0, {}, "--forks must be at least 1, got 0"),
    (-2, {}, "--forks must be at least 1, got -2"),
    (None, {"ANSIBLE_FORKS": "0"}, "ANSIBLE_FORKS='0': expected a whole number of at least 1"),
    (None, {"ANSIBLE_FORKS": "many"}, "ANSIBLE_FORKS='many': expected a whole number of at least 1"),
])
def test_forks_below_one_are_bad_input(tmp_path, forks, environ, message):
    from pycli.cluster.runner import forks_for
    from pycli.core.errors import BadInput

    request = RunRequest(inventory=_nodes_inventory(tmp_path, 2), playbook=Path("site.yml"), forks=forks)
    with pytest.raises(BadInput) as caught:
        forks_for(request, environ=environ, cores=2)
    assert str(caught.value) == message


def test_runs_use_mitogen_s_strategy_unless_told_linear():
    from pycli.cluster.runner import strategy_env

    chosen = strategy_env({})
    assert chosen["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (Path(chosen["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    assert strategy_env({"PYCLI_ANSIBLE_STRATEGY": "linear"}) == {"ANSIBLE_STRATEGY": "linear"}
    with pytest.raises(BadInput, match=r"^PYCLI_ANSIBLE_STRATEGY='free': use mitogen \(the default\) or linear$"):
        strategy_env({"PYCLI_ANSIBLE_STRATEGY": "free"})


def test_only_a_run_of_many_tasks_takes_mitogen(tmp_path):
    short = RunRequest(inventory=tmp_path / "i.ini", module="ping").runner_kwargs(tmp_path)
    assert short["envvars"]["ANSIBLE_STRATEGY"] == "linear" and "ANSIBLE_STRATEGY_PLUGINS" not in short["envvars"]
    many = RunRequest(inventory=tmp_path / "i.ini", playbook=Path("site.yml"), many_tasks=True).runner_kwargs(tmp_path)
    assert many["envvars"]["ANSIBLE_STRATEGY"] == "mitogen_linear"
