"""The monitoring role's dcgm-exporter pieces, rendered by Ansible's own templating: the scrape
targets (file-based discovery), Prometheus's configuration, and the drop-in that starts NVIDIA's
packaged dcgm-exporter against the dcgm role's host engine; that command line is then run with the
stand-in dcgm-exporter of tests/fixtures/nvidia_repo, which takes the real program's flags."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tests.conftest import ROOT, ansible_plugins

ROLE = ROOT / "roles" / "monitoring"


def _render(template: str, host: str = "gpu1", hostvars: dict | None = None, **extra) -> str:
    """The template as the role's template task writes it on `host` (trim_blocks, like the template module)."""
    return _expand((ROLE / "templates" / template).read_text(), host, hostvars, **extra)


def _expand(text: str, host: str = "gpu1", hostvars: dict | None = None, **extra) -> str:
    """`text` templated with the role's variables as on `host`."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def trusted(values: dict) -> dict:
        return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in values.items()}

    ansible_plugins()  # the roles' filters, pycli.cluster.NAME
    hostvars = hostvars or _cluster()
    variables = {
        # Role pycli_node is this role's dependency: its defaults are the play's too.
        **trusted(yaml.safe_load((ROLE.parent / "pycli_node" / "defaults" / "main.yml").read_text())),
        # Its dependencies' defaults: the group names and the controller's folders.
        **trusted(yaml.safe_load((ROLE.parent / "cluster_groups" / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE.parent / "controller_folders" / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE / "vars" / "main.yml").read_text())),
        "groups": {"nodes": list(hostvars), "monitoring": [next(iter(hostvars))]},
        "hostvars": hostvars,
        "ansible_managed": "Ansible managed",
        "inventory_hostname": host,
        "ansible_play_hosts": [name for name, values in hostvars.items() if "ansible_facts" in values],
        **hostvars[host],
        **extra,
    }
    templar = Templar(loader=DataLoader(), variables=variables).copy_with_new_env(trim_blocks=True)
    return templar.template(trust_as_template(text))


def _cluster() -> dict:
    """gpu1 and gpu2 run dcgm-exporter, cpu1 does not, gpu3 was not reached this run (no facts)."""
    def node(address: str | None, runs: bool | None) -> dict:
        facts: dict = {"ansible_host": "192.168.1.3"}
        if address:
            facts["ansible_facts"] = {"default_ipv4": {"address": address}}
        if runs is not None:
            facts["_monitoring_dcgm_exporter"] = runs
        return facts
    return {"gpu1": node("10.0.0.1", True), "cpu1": node("10.0.0.2", False),
            "gpu2": node("10.0.0.3", True), "gpu3": node(None, None)}


def test_dcgm_targets_are_the_gpu_nodes_each_labelled_with_its_name():
    targets = json.loads(_render("targets.json.j2", _port=9400, _fact="_monitoring_dcgm_exporter", _previous=[]))
    assert targets == [{"targets": ["10.0.0.1:9400"], "labels": {"node": "gpu1"}},
                       {"targets": ["10.0.0.3:9400"], "labels": {"node": "gpu2"}}]


def test_a_node_this_run_did_not_reach_keeps_its_dcgm_target_and_the_others_follow_this_run():
    previous = [{"targets": ["10.0.0.9:9400"], "labels": {"node": "gpu3"}},   # not reached: kept
                {"targets": ["10.0.0.2:9400"], "labels": {"node": "cpu1"}},   # no exporter now: dropped
                {"targets": ["10.0.0.8:9400"], "labels": {"node": "gone"}}]   # out of the inventory: dropped
    targets = json.loads(_render("targets.json.j2", _port=9400, _fact="_monitoring_dcgm_exporter", _previous=previous))
    assert [t["labels"]["node"] for t in targets] == ["gpu1", "gpu2", "gpu3"]
    assert targets[2] == previous[0]


def test_node_exporter_targets_are_still_every_node_down_ones_included():
    targets = json.loads(_render("targets.json.j2", _port=9100))
    assert [(t["labels"]["node"], t["targets"]) for t in targets] == [
        ("gpu1", ["10.0.0.1:9100"]), ("cpu1", ["10.0.0.2:9100"]), ("gpu2", ["10.0.0.3:9100"]),
        ("gpu3", ["192.168.1.3:9100"])]  # never reached: its inventory address until a run reaches it


def test_a_node_this_run_did_not_reach_keeps_its_cluster_address_not_its_inventory_one():
    """gpu3 is down now: its target stays where the run that reached it put it (its cluster
    address), not its SSH address, where NodeDown would go on firing once it is back."""
    previous = [{"targets": ["10.0.0.4:9100"], "labels": {"node": "gpu3"}},
                {"targets": ["10.0.0.99:9100"], "labels": {"node": "cpu1"}}]  # reached now: this run's address
    targets = json.loads(_render("targets.json.j2", _port=9100, _previous=previous))
    assert [(t["labels"]["node"], t["targets"]) for t in targets] == [
        ("gpu1", ["10.0.0.1:9100"]), ("cpu1", ["10.0.0.2:9100"]), ("gpu2", ["10.0.0.3:9100"]),
        ("gpu3", ["10.0.0.4:9100"])]


def test_the_daemons_listen_on_the_cluster_s_interface_where_the_inventory_names_one():
    """Not the default route's address, which is a public one on many servers."""
    def node(interface: str | None = None) -> dict:  # the inventory's setting is in the node's variables
        found = {"ansible_host": "192.168.1.3", "ansible_facts": {
            "default_ipv4": {"address": "203.0.113.7"}, "ib_0": {"ipv4": {"address": "10.10.0.3"}}}}
        return {**found, "pycli_network_interface": interface} if interface else found

    assert _expand("{{ __monitoring_listen }}", "n1", {"n1": node("ib-0")}) == "10.10.0.3"
    assert _expand("{{ __monitoring_listen }}", "n1", {"n1": node()}) == "203.0.113.7"  # none named: the default route's
    assert _expand("{{ __monitoring_interface_ipv4 }}", "n1", {"n1": node("eth9")}) == ""
    exporter = _render("node-exporter.default.j2", "n1", {"n1": node("ib-0")})
    assert "--web.listen-address=10.10.0.3:9100 " in exporter
    targets = json.loads(_render("targets.json.j2", "n1", {"n1": node("ib-0")}, _port=9100))
    assert targets[0]["targets"] == ["10.10.0.3:9100"]  # where the exporter listens, not the default route's


@pytest.mark.parametrize("url", [
    "https://alerts.example.com/hooks/gpu-cluster", "http://10.0.0.9:9095", "https://alerts.example.com/",
    # The three the role's preflight took and pycli refused while each had a pattern of its own.
    "https://alerts.example.com?token=abc", "https://alerts.example.com#x", "https://?token=abc",
    "hooks.example.com/alerts", "ftp://x/y", "https://alerts.example.com/a b", "https:///path",
])
def test_the_preflight_takes_exactly_the_webhook_urls_pycli_takes(url):
    from pycli.cluster.model import webhook_problem

    [check] = [task for task in yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
               if "monitoring_alert_webhook_url" in str(task.get("ansible.builtin.assert", {}).get("that", ""))]
    [rule] = [line for line in check["ansible.builtin.assert"]["that"] if "monitoring_alert_webhook_url" in line]
    taken = _expand("{{ (" + rule + ") | string }}", monitoring_alert_webhook_url=url)
    assert taken == str(webhook_problem(url) is None)


def _prometheus_fact(**extra) -> str:
    """What the role records on the monitoring host for pycli top, as server.yml writes it."""
    [task] = [task for task in yaml.safe_load((ROLE / "tasks" / "server.yml").read_text())
              if task.get("ansible.builtin.copy", {}).get("dest") == "{{ __monitoring_fact_file }}"]
    return _expand(task["ansible.builtin.copy"]["content"], **extra)


def test_pycli_top_asks_prometheus_where_the_role_recorded_it_listens(tmp_path, monkeypatch):
    import http.server
    import threading

    from pycli.top import prometheus

    class Prometheus(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": {"result": []}}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        fact = tmp_path / "monitoring.fact"
        fact.write_text(_prometheus_fact(monitoring_listen_address="127.0.0.1", monitoring_prometheus_port=port))
        daemon_args = _render("prometheus.default.j2", monitoring_listen_address="127.0.0.1", monitoring_prometheus_port=port)
        assert f"--web.listen-address=127.0.0.1:{port} " in daemon_args
        monkeypatch.setattr(prometheus, "MONITORING_FACT", str(fact))
        out = subprocess.run(["sh", "-c", prometheus.query_command()], capture_output=True, text=True, timeout=60).stdout
    finally:
        server.shutdown()
    assert json.loads(out)["address"] == f"127.0.0.1:{port}"
    assert prometheus.parse_answers(out, ["gpu1"])["gpu1"].why.startswith("Prometheus does not scrape it")


def test_the_role_writes_its_local_fact_where_pycli_top_reads_it():
    """The fact `monitoring` in Ansible's local facts folder: the role's README names it for pycli top."""
    from pycli.top import prometheus

    written = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__monitoring_fact_file"]
    assert written == prometheus.MONITORING_FACT == "/etc/ansible/facts.d/monitoring.fact"
    assert "`/etc/ansible/facts.d/monitoring.fact`" in (ROLE / "README.md").read_text()


def test_pycli_top_without_the_roles_record_says_so_in_one_line(tmp_path, monkeypatch):
    from pycli.top import prometheus

    missing = tmp_path / "monitoring.fact"
    monkeypatch.setattr(prometheus, "MONITORING_FACT", str(missing))
    out = subprocess.run(["sh", "-c", prometheus.query_command()], capture_output=True, text=True, timeout=60).stdout
    with pytest.raises(prometheus.PrometheusUnavailable) as raised:
        prometheus.parse_answers(out, ["gpu1"])
    assert str(raised.value).startswith(f"{missing} is missing or unreadable (")
    assert str(raised.value).endswith("): provision the cluster again") and "\n" not in str(raised.value)


def test_alertmanager_answers_on_the_monitoring_host_alone():
    """Its API silences alerts: no job on another node reaches it; Prometheus beside it does."""
    assert '--web.listen-address=127.0.0.1:9093 ' in _render("alertmanager.default.j2")
    config = yaml.safe_load(_render("prometheus.yml.j2", host="gpu1"))
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["alertmanager"]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    assert jobs["prometheus"]["static_configs"][0]["targets"] == ["10.0.0.1:9090"]


def test_prometheus_scrapes_dcgm_exporter_from_its_own_targets_file(tmp_path):
    config = yaml.safe_load(_render("prometheus.yml.j2", host="gpu1"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["dcgm"]["file_sd_configs"] == [{"files": ["/etc/prometheus/file_sd/dcgm.json"]}]
    assert set(jobs) == {"prometheus", "alertmanager", "node", "dcgm"}
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not on PATH: run `bash scripts/host-prereqs.sh` (as root) to install it", pytrace=False)
    path = tmp_path / "prometheus.yml"
    path.write_text(_render("prometheus.yml.j2", host="gpu1"))
    checked = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _exec_start(dropin: str) -> list[str]:
    lines = [line.split("=", 1)[1] for line in dropin.splitlines() if line.startswith("ExecStart=")]
    assert lines[0] == "", "the packaged ExecStart is reset first"
    [command] = lines[1:]
    return shlex.split(command)


def test_the_dropin_runs_the_packaged_binary_against_the_host_engine_on_the_cluster_address():
    dropin = _render("dcgm-exporter.conf.j2", host="gpu1")
    argv = _exec_start(dropin)
    assert argv[0] == "/usr/bin/dcgm-exporter"
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags == {"--collectors": "/etc/dcgm-exporter/pycli-counters.csv", "--address": "10.0.0.1:9400",
                     "--remote-hostengine-info": "127.0.0.1:5555",
                     "--hpc-job-mapping-dir": "/run/pycli/dcgm-job-mapping"}
    assert "PartOf=nvidia-dcgm.service" in dropin.splitlines()
    assert "ExecStartPre=/bin/mkdir -p /run/pycli/dcgm-job-mapping" in dropin.splitlines()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(url: str, deadline_s: float = 10) -> str:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def test_the_dropins_command_line_starts_the_stand_in_exporter_with_the_roles_counters(tmp_path):
    """What the molecule scenario runs on a node, here: the drop-in's flags, the role's counters
    file, a host engine on a port of this machine, and the job mapping the Slurm prolog writes."""
    spec = importlib.util.spec_from_file_location("build_repo", ROOT / "tests/fixtures/nvidia_repo/build_repo.py")
    build_repo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_repo)
    exporter = tmp_path / "dcgm-exporter"
    exporter.write_text(build_repo.DCGM_EXPORTER.replace("{ver}", "4.8.2"))
    engine = socket.create_server(("127.0.0.1", 0))
    port, mapping = _free_port(), tmp_path / "mapping"
    mapping.mkdir()
    argv = _exec_start(_render("dcgm-exporter.conf.j2", host="gpu1", __monitoring_listen="127.0.0.1",
                               monitoring_dcgm_exporter_port=port,
                               monitoring_dcgm_hostengine=f"127.0.0.1:{engine.getsockname()[1]}",
                               pycli_node_dcgm_job_mapping_dir=str(mapping),
                               __monitoring_dcgm_counters=str(ROLE / "files" / "dcgm-counters.csv")))
    proc = subprocess.Popen([sys.executable, str(exporter), *argv[1:], "--record", str(tmp_path / "record.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        metrics = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert '# TYPE DCGM_FI_DEV_XID_ERRORS gauge' in metrics
        assert ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",device="nvidia0",'
                'modelName="NVIDIA Stand-in GPU (pycli fixture)",Hostname="') in metrics
        (mapping / "0").write_text("12\n13\n")
        jobs = [line for line in _scrape(f"http://127.0.0.1:{port}/metrics").splitlines()
                if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        assert [line.split('hpc_job="')[1].split('"')[0] for line in jobs] == ["12", "13"]
        assert json.loads((tmp_path / "record.json").read_text())["hostengine"].startswith("remote 127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(10)
        engine.close()


def test_the_stand_in_exporter_will_not_start_without_its_host_engine(tmp_path):
    spec = importlib.util.spec_from_file_location("build_repo", ROOT / "tests/fixtures/nvidia_repo/build_repo.py")
    build_repo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_repo)
    exporter = tmp_path / "dcgm-exporter"
    exporter.write_text(build_repo.DCGM_EXPORTER)
    ran = subprocess.run([sys.executable, str(exporter), "-f", str(ROLE / "files" / "dcgm-counters.csv"),
                          "-a", f"127.0.0.1:{_free_port()}", "-r", f"127.0.0.1:{_free_port()}",
                          "--record", str(tmp_path / "record.json")], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 1 and "cannot connect to the host engine at 127.0.0.1:" in ran.stderr


def _verify_assert(active_targets: list[dict], play_hosts: list[str]) -> tuple[bool, str]:
    """The role's last check (tasks/verify.yml), evaluated as Ansible does on Prometheus's answer."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    task = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())[1]
    hostvars = _cluster()
    for name, facts in hostvars.items():
        facts["inventory_hostname"] = name
    variables = {
        **yaml.safe_load((ROLE.parent / "cluster_groups" / "defaults" / "main.yml").read_text()),  # a dependency's
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
        **task["vars"],
        "groups": {"nodes": list(hostvars), "monitoring": ["gpu1"]},
        "hostvars": hostvars, "ansible_play_hosts": play_hosts, "__monitoring_listen": "10.0.0.1",
        "__monitoring_targets": {"status": 200, "json": {"data": {"activeTargets": active_targets}}},
    }
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    check = task["ansible.builtin.assert"]
    passed = all(templar.template(trust_as_template("{{ " + that + " }}")) for that in check["that"])
    return passed, "" if passed else templar.template(trust_as_template(check["fail_msg"]))


def _target(job: str, node: str, health: str = "up") -> dict:
    return {"labels": {"job": job, "node": node}, "health": health, "lastError": "" if health == "up" else "refused"}


def test_verify_wants_the_dcgm_exporter_of_every_gpu_node_that_answered_up():
    answered = ["gpu1", "cpu1", "gpu2"]  # gpu3 is down: not waited for
    nodes = [_target("node", name) for name in answered]
    assert _verify_assert(nodes + [_target("dcgm", "gpu1"), _target("dcgm", "gpu2")], answered) == (True, "")
    passed, said = _verify_assert(nodes + [_target("dcgm", "gpu1", "down")], answered)
    assert not passed
    assert "gpu1 dcgm-exporter: refused" in said and "gpu2 dcgm-exporter: not among the targets" in said
    assert "cpu1" not in said
