"""The pure parts of `pycli provision`: extra vars, the run request, the per-host view and its display."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from pycli.cluster.model import Cluster, Host
from pycli.core.errors import EXIT_INTERRUPTED, BadInput
from pycli.provision.extra_vars import parse_extra_vars
from pycli.provision.recap import END_TASK, last_unfinished
from pycli.provision.run import (
    CACHE_PLAYBOOK,
    ProvisionRequest,
    build_request,
    exit_code,
    provision,
    stale_slurm_line,
    unfinished_line,
)
from pycli.provision.view import ProvisionView, RunDisplay


def test_extra_vars_are_strings_as_given_and_files_keep_their_yaml_types(tmp_path):
    extra = tmp_path / "vars.yml"
    extra.write_text("openmpi_version: 4.1.8\nhorovod_gloo: true\n")
    found = parse_extra_vars(["a=1", "b=true", "c=hello world", "d=", f"@{extra}"])
    assert found == {"a": "1", "b": "true", "c": "hello world", "d": "", "openmpi_version": "4.1.8", "horovod_gloo": True}


def test_key_value_is_never_read_as_yaml():
    # As `ansible-playbook -e key=value`: 2.10 stays 2.10 (not the float 2.1), 12:30 is no
    # sexagesimal 750, a date stays text that can be serialised.
    found = parse_extra_vars(["horovod_torch_version=2.10", "t=12:30", "d=2024-01-01", "e=a=b", "n=null"])
    assert found == {"horovod_torch_version": "2.10", "t": "12:30", "d": "2024-01-01", "e": "a=b", "n": "null"}


def test_an_inline_mapping_is_read_as_ansible_reads_one():
    found = parse_extra_vars(['{"nvidia_driver_reboot": false, "slots": 2}', "x=1"])
    assert found == {"nvidia_driver_reboot": False, "slots": 2, "x": "1"}


def test_a_vars_file_with_dates_becomes_json_safe(tmp_path):
    extra = tmp_path / "vars.yml"
    extra.write_text("day: 2024-01-01\nwhen: 2024-01-01 10:20:30\nnested: [{d: 2023-12-31}]\n")
    found = parse_extra_vars([f"@{extra}"])
    assert found == {"day": "2024-01-01", "when": "2024-01-01T10:20:30", "nested": [{"d": "2023-12-31"}]}
    json.dumps(found)


@pytest.mark.parametrize("text", ["blob: !!binary aGVsbG8=\n", "s: !!set {a: null}\n", "2024-01-01: x\n"])
def test_a_vars_file_ansible_cannot_take_is_one_line(tmp_path, text):
    extra = tmp_path / "vars.yml"
    extra.write_text(text)
    with pytest.raises(BadInput) as caught:
        parse_extra_vars([f"@{extra}"])
    assert str(caught.value).startswith(f"-e @{extra}: ") and "\n" not in str(caught.value)


def test_a_binary_vars_file_is_one_line(tmp_path):
    extra = tmp_path / "vars.bin"
    extra.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(BadInput, match="not UTF-8 text"):
        parse_extra_vars([f"@{extra}"])


@pytest.mark.parametrize(
    ("item", "message"),
    [("novalue", "expected key=value"), ("bad key=1", "expected key=value"), ("@/nonexistent.yml", "cannot read")],
)
def test_bad_extra_vars_are_refused(item, message):
    with pytest.raises(BadInput, match=message):
        parse_extra_vars([item])


def test_extra_vars_file_must_hold_a_mapping(tmp_path):
    extra = tmp_path / "list.yml"
    extra.write_text("- a\n- b\n")
    with pytest.raises(BadInput, match="mapping"):
        parse_extra_vars([f"@{extra}"])


def read_from(inventory):
    inventory.write_text("[nodes]\nnode1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2\n")
    return Cluster(hosts=(Host("node1", "10.0.0.1"), Host("node2", "10.0.0.2")), launcher="node1", inventory=inventory)


@pytest.mark.parametrize("limit", ["node1", "node*", "!node1", "nodes:&node2", "~node[12]", "node1,ghost", "localhost"])
def test_a_limit_that_leaves_a_host_is_taken(tmp_path, limit):
    assert build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(limit=limit)).limit == limit


@pytest.mark.parametrize(("limit", "message"), [
    ("nosuchhost", "--limit 'nosuchhost' matches no host of"),
    ("all:!node1:!node2", "matches no host of"),
    ("@/nonexistent/retry", "--limit '@/nonexistent/retry': Unable to find limit file"),
])
def test_a_limit_that_leaves_no_host_is_bad_input(tmp_path, capsys, limit, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[")):
        build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(limit=limit))
    assert capsys.readouterr().err == ""  # Ansible's own warning is not printed beside pycli's line


def test_request_is_site_yml_with_the_options_given(tmp_path):
    asked = ProvisionRequest(limit="node1", tags="openmpi", check=True, extra_vars=("x=2",), forks=5)
    request = build_request(read_from(tmp_path / "hosts.ini"), asked)
    assert request.playbook.name == "site.yml" and request.module is None
    assert request.inventory == tmp_path / "hosts.ini"
    assert request.extravars == {"x": "2"}
    kwargs = request.runner_kwargs(tmp_path / "run", extravars_file=tmp_path / "vars.json")
    assert kwargs["limit"] == "node1" and kwargs["forks"] == 5
    assert kwargs["cmdline"] == f"-e @{tmp_path / 'vars.json'} --check --tags openmpi"


def test_request_refuses_zero_forks_and_missing_playbooks(tmp_path):
    with pytest.raises(BadInput, match="--forks"):
        build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(forks=0))
    with pytest.raises(BadInput, match="does not exist"):
        build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(playbook=tmp_path / "nope.yml"))


@pytest.mark.parametrize(("flag", "field", "value"), [
    ("--tags", "tags", "it's"), ("--skip-tags", "skip_tags", "it's"), ("--tags", "tags", "a b"),
    ("--skip-tags", "skip_tags", "docker,"), ("--tags", "tags", "x;rm"),
])
def test_tags_are_comma_separated_names(tmp_path, flag, field, value):
    with pytest.raises(BadInput) as caught:
        build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(**{field: value}))
    assert str(caught.value).startswith(f"{flag} {value!r}:") and "\n" not in str(caught.value)


def test_tag_names_may_hold_dots_colons_dashes(tmp_path):
    asked = ProvisionRequest(tags="openmpi,nvidia_driver,a.b:c-d", skip_tags="docker")
    request = build_request(read_from(tmp_path / "hosts.ini"), asked)
    assert (request.tags, request.skip_tags) == ("openmpi,nvidia_driver,a.b:c-d", "docker")


def test_offline_tells_the_roles_to_download_nothing(tmp_path):
    request = build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest(offline=True, extra_vars=("x=2",)))
    assert request.extravars == {"x": "2", "pycli_offline": True}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def ev(kind, host=None, **data):
    return {"event": kind, "event_data": {**({"host": host} if host else {}), **data}}


def test_view_follows_each_host_through_tasks_and_records_failures():
    clock = Clock()
    view = ProvisionView(["n1", "n2"], clock=clock)
    view.handle(ev("playbook_on_play_start", play="Install the stack"))
    view.handle(ev("runner_on_start", "n1", task="Build OpenMPI", role="openmpi"))
    view.handle(ev("runner_on_start", "n2", task="openmpi : Build OpenMPI", role="openmpi"))
    assert view.play == "Install the stack"
    assert view.hosts["n1"].task == "openmpi : Build OpenMPI" == view.hosts["n2"].task
    clock.now = 130.0
    view.handle(ev("runner_on_ok", "n1", task="Build OpenMPI", res={"changed": True}))
    view.handle(ev("runner_on_failed", "n2", task="Build OpenMPI", res={"msg": "make: *** Error 2"}))
    assert view.in_progress() == ["n1 (openmpi : Build OpenMPI)", "n2 (openmpi : Build OpenMPI)"]
    view.finish()
    assert view.hosts["n1"].elapsed(clock.now) == 30.0
    assert view.notes == ["n2: Build OpenMPI: make: *** Error 2"]
    assert exit_code("failed", view) == 1


def test_a_recap_note_of_a_role_is_a_line_of_the_recap_once_and_an_empty_one_none():
    view = ProvisionView(["n1", "n2"], clock=Clock())
    note = "SSH trust: n2 not reached; kept as last recorded"
    view.handle(ev("runner_on_ok", "n1", task="Recap note: nodes this run did not reach", role="ssh_trust", res={"msg": note}))
    view.handle(ev("runner_on_ok", "n1", task="Recap note: nodes this run did not reach", role="ssh_trust", res={"msg": note}))
    view.handle(ev("runner_on_ok", "n1", task="Recap note: something else", res={"msg": "  "}))
    view.handle(ev("runner_on_ok", "n1", task="An ordinary debug", res={"msg": "not for the recap"}))
    assert view.notes == [f"note: {note}"]
    assert exit_code("successful", view) == 0


def test_unreachable_wins_over_failed_and_cancel_is_130():
    view = ProvisionView(["n1", "n2"], clock=Clock())
    view.handle(ev("runner_on_failed", "n1", task="t", res={"msg": "boom"}))
    assert exit_code("failed", view) == 1
    view.handle(ev("runner_on_unreachable", "n2", task="Gathering Facts", res={"msg": "ssh: connect to host n2 port 22: No route"}))
    assert exit_code("failed", view) == 4
    assert view.hosts["n2"].task == "unreachable"
    assert exit_code("canceled", view) == EXIT_INTERRUPTED


def test_clean_run_is_0_and_the_table_lists_every_host():
    view = ProvisionView(["n1", "n2"], clock=Clock())
    for host in ("n1", "n2"):
        view.handle(ev("runner_on_start", host, task="ping"))
        view.handle(ev("runner_on_ok", host, task="ping", res={}))
    view.finish()
    assert exit_code("successful", view) == 0
    assert view.table(False).row_count == 2


def test_past_a_screenful_the_live_view_summarises_and_the_recap_keeps_every_host():
    from rich.console import Console

    clock = Clock()
    names = [f"node{i:03d}" for i in range(1, 201)]
    view = ProvisionView(names, clock=clock)
    view.handle(ev("playbook_on_play_start", play="Base system"))
    for i, name in enumerate(names[:190]):
        clock.now = 100.0 + i
        view.handle(ev("runner_on_start", name, task=f"task {i % 8}", role="common"))
    for name in names[:12]:
        view.handle(ev("runner_on_failed", name, task="task 0", res={"msg": "disk full"}))
    view.handle(ev("runner_on_unreachable", "node150", task="task 6", res={"msg": "no route"}))
    clock.now = 400.0
    live = view.table(True, max_rows=30)
    console = Console(record=True, width=200)
    console.print(live)
    text = console.export_text()
    assert live.row_count <= 6 + 1 + 1 + 2 + 1  # tasks, other tasks, waiting, failed/unreachable, slowest
    rows = [" ".join(line.strip("│ ").split()) for line in text.splitlines()]
    assert "10 │ waiting" in rows and "23 │ common : task 4" == rows[4]  # the busiest task first
    assert "failed: node001, node002" in text and "and 4 more" in text and "unreachable: node150" in text
    assert "slowest: node013 288s (common : task 4)" in text  # the earliest started still running
    assert view.table(True, max_rows=300).row_count == 200 and view.table(False).row_count == 200


def test_a_host_that_never_reached_the_end_of_site_yml_is_incomplete_not_ok():
    view = ProvisionView(["n1", "n2", "n3"], clock=Clock(), end_task=END_TASK)
    for host in ("n1", "n2", "n3"):
        view.handle(ev("runner_on_ok", host, task="Gathering Facts", res={}))
    view.handle(ev("runner_on_unreachable", "n3", task="Install", res={"msg": "ssh: connect to host n3 port 22"}))
    view.handle(ev("runner_on_ok", "n1", task=END_TASK, res={}))
    view.handle(ev("runner_on_ok", "localhost", task="Stop when the inventory has no nodes", res={}))
    assert view.states() == {"n1": "ok", "n2": "incomplete", "n3": "UNREACHABLE", "localhost": "ok"}
    assert exit_code("successful", view) == 4
    cluster = Cluster(hosts=(Host("n1", "a"), Host("n2", "b"), Host("n3", "c")), launcher="n1", inventory=Path("c.ini"))
    line = unfinished_line(view, cluster)
    assert line == "not finished: n2 incomplete, n3 unreachable; once fixed, 'pycli provision c.ini --retry' runs on just these"
    # A run through the slurm role that did not reach every node: those keep the slurm.conf they had.
    assert stale_slurm_line(view, cluster, ProvisionRequest()) == ""  # no Slurm
    slurm_cluster = replace(cluster, slurm_controller="n1")
    assert stale_slurm_line(view, slurm_cluster, ProvisionRequest(tags="slurm")) == (
        "Slurm: n2, n3 keep the slurm.conf they had, unlike the other nodes; run 'pycli provision c.ini --tags slurm "
        "--retry' once they answer")
    assert stale_slurm_line(view, slurm_cluster, ProvisionRequest(tags="docker")) == ""
    assert stale_slurm_line(view, slurm_cluster, ProvisionRequest(skip_tags="slurm")) == ""
    # Without the unreachable host, an incomplete one still fails the run.
    view.hosts.pop("n3")
    view.hosts.pop("localhost")
    assert exit_code("successful", view) == 1


def test_a_host_whose_failure_a_rescue_took_up_ends_ok():
    view = ProvisionView(["n1", "n2"], clock=Clock(), end_task=END_TASK)
    for host in ("n1", "n2"):
        view.handle(ev("runner_on_failed", host, task="Wait for the cache's port", res={"msg": "Timeout"}))
        view.handle(ev("runner_on_ok", host, task=END_TASK, res={}))
    view.handle(ev("playbook_on_stats", rescued={"n1": 1}, failures={"n2": 1}))
    assert view.states() == {"n1": "ok", "n2": "FAILED"}


def test_a_playbook_without_the_end_task_has_no_incomplete_hosts():
    view = ProvisionView(["n1"], clock=Clock())
    view.handle(ev("runner_on_ok", "n1", task="ping", res={}))
    assert view.states() == {"n1": "ok"} and exit_code("successful", view) == 0


def test_the_task_pycli_waits_for_is_the_last_task_of_site_yml():
    import yaml

    from pycli.provision.run import SITE_PLAYBOOK

    last_play = yaml.safe_load(SITE_PLAYBOOK.read_text())[-1]
    assert last_play["hosts"] == "{{ cluster_groups_nodes }}" and "always" in last_play["tags"]
    assert last_play["tasks"][-1]["name"] == END_TASK


def _plays(path):
    import yaml

    for play in yaml.safe_load(path.read_text()):
        imported = play.get("ansible.builtin.import_playbook")
        if imported:
            yield from _plays(path.parent / imported)
        else:
            yield play


def test_retry_hosts_reach_every_node_play_but_trust_and_the_end_take_every_node():
    from pycli.provision.run import SITE_PLAYBOOK

    hosts = {play["name"]: play["hosts"] for play in _plays(SITE_PLAYBOOK)}
    every_node = {name for name, pattern in hosts.items() if pattern == "{{ cluster_groups_nodes }}"}
    assert every_node == {"SSH trust between the nodes", "End of the run"}
    # Slurm's and monitoring's plays: every node too, where the inventory opts in (tests/unit/playbooks/test_slurm_play.py).
    hosts.pop("Slurm scheduler")
    hosts.pop("Monitoring")
    # The package cache's play: the retried nodes, and the cache host too where the inventory has one.
    assert hosts.pop("Package cache for the nodes' apt").startswith("{{ pycli_hosts | default(cluster_groups_nodes) }}{{ (':' ~ ")
    others = {pattern for name, pattern in hosts.items() if pattern not in ("{{ cluster_groups_nodes }}", "localhost")}
    assert others == {"{{ pycli_hosts | default(cluster_groups_nodes) }}"}
    assert not any("serial" in play for play in _plays(SITE_PLAYBOOK))  # one dead node must not end the run


def test_retry_passes_the_hosts_and_refuses_a_limit(tmp_path):
    cluster = read_from(tmp_path / "hosts.ini")
    request = build_request(cluster, ProvisionRequest(hosts=("node2",)))
    assert request.extravars == {"pycli_hosts": "node2"} and request.limit is None
    with pytest.raises(BadInput, match="--retry picks the hosts itself"):
        build_request(cluster, ProvisionRequest(retry=True, limit="node1"))
    with pytest.raises(BadInput, match="--retry works with site.yml, not cache.yml"):
        build_request(cluster, ProvisionRequest(retry=True, playbook=CACHE_PLAYBOOK))
    with pytest.raises(BadInput, match="ghost: not in"):
        build_request(cluster, ProvisionRequest(hosts=("ghost",)))


def _recap(runs, name, inventory, states, age):
    folder = runs / name
    folder.mkdir(parents=True)
    path = folder / "recap.json"
    path.write_text(json.dumps({"inventory": str(inventory.resolve()), "hosts": states}))
    os.utime(path, (age, age))


def test_retry_takes_the_unfinished_hosts_of_the_newest_run_of_that_inventory(tmp_path):
    cluster = read_from(tmp_path / "hosts.ini")
    runs = tmp_path / "runs"
    _recap(runs, "20260101-000000-provision", cluster.inventory_path, {"node1": "FAILED", "node2": "ok"}, 1000)
    _recap(runs, "20260102-000000-provision", cluster.inventory_path, {"node1": "ok", "node2": "UNREACHABLE"}, 2000)
    _recap(runs, "20260103-000000-provision", tmp_path / "other.ini", {"node1": "FAILED"}, 3000)
    (runs / "20260104-000000-provision").mkdir()
    (runs / "20260104-000000-provision" / "recap.json").write_text("{not json")
    assert last_unfinished(cluster, runs) == (runs / "20260102-000000-provision", ["node2"])


def test_retry_after_the_inventory_moved_takes_the_runs_of_the_cluster_it_names(tmp_path):
    from dataclasses import replace

    from pycli.provision.recap import write_recap

    first = replace(read_from(tmp_path / "hosts.ini"), settings={"pycli_cluster_name": "lab-a"})
    runs = tmp_path / "runs"
    (runs / "20260101-000000-provision").mkdir(parents=True)
    write_recap(runs / "20260101-000000-provision", first, {"node1": "ok", "node2": "UNREACHABLE"})
    moved = replace(first, inventory=tmp_path / "moved.ini")
    assert last_unfinished(moved, runs) == (runs / "20260101-000000-provision", ["node2"])
    with pytest.raises(BadInput, match="no earlier 'pycli provision'"):  # a file that names no cluster: its path
        last_unfinished(replace(moved, settings={}), runs)


def test_provisioning_is_a_run_of_many_tasks(tmp_path):
    """It takes Mitogen's strategy (pycli/cluster/runner.py, strategy_env); short runs keep Ansible's own."""
    assert build_request(read_from(tmp_path / "hosts.ini"), ProvisionRequest()).many_tasks


def test_retry_without_an_earlier_run_is_one_line(tmp_path):
    with pytest.raises(BadInput, match=r"^--retry: no earlier 'pycli provision' of .*hosts.ini under"):
        last_unfinished(read_from(tmp_path / "hosts.ini"), tmp_path / "runs")


def test_retry_after_a_run_that_finished_everything_runs_nothing(tmp_path, monkeypatch):
    cluster = read_from(tmp_path / "hosts.ini")
    monkeypatch.setenv("PYCLI_RUNS", str(tmp_path / "runs"))
    _recap(tmp_path / "runs", "20260102-000000-provision", cluster.inventory_path, {"node1": "ok", "node2": "ok"}, 2000)
    console = Console(record=True, width=400)
    assert provision(cluster, ProvisionRequest(retry=True), console=console) == 0
    assert "nothing to retry" in console.export_text()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["20260102-000000-provision"]  # no new run


def test_the_request_carries_forks_computed_from_the_inventory_unless_ansible_forks_is_set(tmp_path, monkeypatch):
    from pycli.cluster.runner import default_forks

    monkeypatch.delenv("ANSIBLE_FORKS", raising=False)
    cluster = read_from(tmp_path / "hosts.ini")
    assert build_request(cluster, ProvisionRequest()).forks == default_forks(len(cluster.hosts), os.cpu_count())
    assert build_request(cluster, ProvisionRequest(forks=7)).forks == 7
    monkeypatch.setenv("ANSIBLE_FORKS", "9")
    assert build_request(cluster, ProvisionRequest()).forks is None
    assert build_request(cluster, ProvisionRequest(forks=7)).forks == 7


def _failing_run(events):
    """A stand-in for runner.run that hands `events` to the display and ends as Ansible would."""
    from pycli.cluster import runner

    def run(request, run_dir, on_event=None, cancel=None):
        run_dir.mkdir(parents=True, exist_ok=True)
        for event in events:
            on_event(event)
        return runner.RunResult(status="failed", rc=2, run_dir=run_dir, hosts={})

    return run


def test_off_a_terminal_each_play_and_failure_is_a_line_as_it_comes_and_not_again_in_the_recap():
    console = Console(record=True, width=200, force_terminal=False)
    view = ProvisionView(["n1", "n2"], clock=Clock())
    with RunDisplay(view, console) as display:
        display.on_event(ev("playbook_on_play_start", play="Base system"))
        display.on_event(ev("runner_on_start", "n1", task="apt"))
        display.on_event(ev("runner_on_failed", "n1", task="apt", res={"msg": "no space"}))
        assert console.export_text(clear=False).splitlines() == ["play: Base system", "  n1: apt: no space"]
    display.show_recap()
    text = console.export_text()
    assert text.count("n1: apt: no space") == 1 and "FAILED" in text


def test_with_verbosity_nothing_is_printed_during_the_run_and_the_recap_holds_every_failure():
    console = Console(record=True, width=200, force_terminal=False)
    view = ProvisionView(["n1"], clock=Clock())
    with RunDisplay(view, console, verbosity=1) as display:
        display.on_event(ev("playbook_on_play_start", play="Base system"))
        display.on_event(ev("runner_on_failed", "n1", task="apt", res={"msg": "no space"}))
    assert console.export_text(clear=False) == ""
    display.show_recap(with_notes=False)
    assert "no space" not in console.export_text(clear=False)
    display.show_recap()
    assert "  n1: apt: no space" in console.export_text()


def test_square_brackets_in_a_play_or_a_message_are_printed_as_they_are():
    console = Console(record=True, width=200, force_terminal=False)
    view = ProvisionView(["n1"], clock=Clock())
    display = RunDisplay(view, console)
    display.on_event(ev("playbook_on_play_start", play="Hosts of [nodes]"))
    display.on_event(ev("runner_on_failed", "n1", task="Check", res={"msg": "name the group [slurm_controller] in the inventory"}))
    display.on_event(ev("runner_on_failed", "n1", task="Again", res={"msg": "[bold]not bold[/bold]"}))
    display.show_recap()
    text = console.export_text()
    assert "play: Hosts of [nodes]" in text and "n1: Check: name the group [slurm_controller] in the inventory" in text
    assert "n1: Again: [bold]not bold[/bold]" in text


def test_on_a_terminal_the_live_table_follows_the_events_and_is_gone_after_the_run():
    console = Console(record=True, width=200, height=40, force_terminal=True)
    view = ProvisionView(["n1"], clock=Clock())
    with RunDisplay(view, console) as display:
        display.on_event(ev("runner_on_start", "n1", task="Build OpenMPI", role="openmpi"))
        display.on_event(ev("runner_on_failed", "n1", task="Build OpenMPI", res={"msg": "make: *** Error 2"}))
        assert display.notes_shown == 0  # the live table shows the failure; its line waits for the recap
    display.show_recap()
    assert "n1: Build OpenMPI: make: *** Error 2" in console.export_text()


def test_provision_shows_the_run_and_writes_the_recap_of_site_yml(tmp_path, monkeypatch):
    from pycli.cluster import runner

    cluster = read_from(tmp_path / "hosts.ini")
    monkeypatch.setenv("PYCLI_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(runner, "run", _failing_run([
        ev("playbook_on_play_start", play="Base system"),
        ev("runner_on_ok", "node1", task=END_TASK, res={}),
        ev("runner_on_failed", "node2", task="apt", res={"msg": "no space"}),
    ]))
    console = Console(record=True, width=400, force_terminal=False)
    assert provision(cluster, ProvisionRequest(), console=console) == 1
    lines = console.export_text().splitlines()
    assert lines[1:3] == ["play: Base system", "  node2: apt: no space"]
    assert lines[-2].startswith("provisioning failed after") and lines[-1].startswith("not finished: node2 failed;")
    [recap] = (tmp_path / "runs").glob("*-provision/recap.json")
    assert json.loads(recap.read_text())["hosts"] == {"node1": "ok", "node2": "FAILED"}
