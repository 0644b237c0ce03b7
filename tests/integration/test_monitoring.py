"""Monitoring on the session's provisioned 2-node cluster: a second inventory of the same nodes opts
in (group monitoring, node1) and `pycli provision --tags monitoring` adds node-exporter on both
nodes and Prometheus with pycli's alert rules and Alertmanager on node1. Alertmanager posts to a
webhook receiver that runs on node1 for the test; a stopped exporter on node2 must reach it as
NodeDown, then as resolved. Scrapes, rule evaluations and Alertmanager's group wait and interval
every 5 s here (15 s, 15 s, 30 s and 5 min by default), so the alert's way through takes seconds
more than the rule's own `for`."""

import json
import re
import time
import urllib.parse
from pathlib import Path

import docker
import pytest

from tests.conftest import run_pycli
from tests.integration.conftest import CLUSTER, frozen, node_run
from tests.integration.test_cache_stage import changed_tasks
from tests.integration.test_node_down import _address
from tests.integration.test_top import top_frame

pytestmark = pytest.mark.integration
INTERVAL_S = 5
GROUP_WAIT_S = 5
# NodeDown's `for:` here (monitoring_alert_for); the role's rules say 1m, which the test would wait out.
NODE_DOWN_FOR_S = 10
RECEIVER_PORT = 9199
RECEIVED = "/tmp/pycli-test-alerts.jsonl"
# A webhook receiver: every POST's body appended to RECEIVED as one line.
RECEIVER = f"""
import http.server, json
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open({RECEIVED!r}, "a") as out:
            out.write(json.dumps(body) + "\\n")
        self.send_response(200)
        self.end_headers()
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", {RECEIVER_PORT}), Receiver).serve_forever()
"""


def node_get(node: str, url: str) -> tuple[int, str]:
    """GET `url` from `node` (no curl in the node image: its Python)."""
    return node_run(node, "python3", "-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10)"
                    ".read().decode())", url)


def _run_dir(output: str) -> Path:
    return Path(re.search(r"run folder (\S+)", output).group(1))


def prometheus(inventory: Path, query: str) -> list[dict]:
    """An instant query on node1's Prometheus, from node1 (it listens on the cluster address only)."""
    url = f"http://{_address(inventory, 'node1')}:9090/api/v1/query?query={urllib.parse.quote(query)}"
    code, out = node_get("node1", url)
    assert code == 0, out
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@pytest.fixture(scope="module")
def monitored(provisioned_cluster, tmp_path_factory):
    """The same nodes through an inventory with monitoring; provisioned with the monitoring role alone."""
    node_run("node1", "rm", "-f", RECEIVED)
    docker.from_env().containers.get(f"pycli-{CLUSTER}-node1").exec_run(["python3", "-c", RECEIVER], detach=True)
    receiver = f"http://{_address(provisioned_cluster, 'node1')}:{RECEIVER_PORT}/"
    deadline = time.monotonic() + 30
    while node_get("node1", receiver)[0] != 0:
        assert time.monotonic() < deadline, "the webhook receiver did not start on node1"
        time.sleep(0.5)
    inventory = tmp_path_factory.mktemp("monitoring") / "monitoring.ini"
    inventory.write_text(provisioned_cluster.read_text() + "\n[monitoring]\nnode1\n\n[monitoring:vars]\n"
                         f"monitoring_alert_webhook_url=http://{_address(provisioned_cluster, 'node1')}:{RECEIVER_PORT}/alerts\n"
                         f"monitoring_scrape_interval={INTERVAL_S}s\nmonitoring_evaluation_interval={INTERVAL_S}s\n"
                         f"monitoring_alert_group_wait={GROUP_WAIT_S}s\nmonitoring_alert_group_interval={GROUP_WAIT_S}s\n"
                         f'monitoring_alert_for={{"NodeDown": "{NODE_DOWN_FOR_S}s"}}\n')
    started = time.monotonic()
    proc = run_pycli("provision", str(inventory), "--tags", "monitoring", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    print(f"\nmonitoring role on 2 nodes: {time.monotonic() - started:.0f} s")
    yield inventory
    for node, services in (("node1", "prometheus prometheus-alertmanager prometheus-node-exporter"),
                           ("node2", "prometheus-node-exporter")):
        node_run(node, "bash", "-c", f"systemctl disable --now {services}")
    node_run("node1", "pkill", "-f", "serve_forever")


def test_prometheus_scrapes_both_nodes_and_a_second_run_changes_nothing(monitored):
    # The role waits for the nodes' exporters; Prometheus's first scrape of itself and of
    # Alertmanager may come up to one interval after it (each target has its own offset).
    all_up = {("node", "node1"): "1", ("node", "node2"): "1", ("prometheus", "node1"): "1", ("alertmanager", "node1"): "1"}
    deadline = time.monotonic() + 3 * INTERVAL_S
    while (targets := {(r["metric"]["job"], r["metric"]["node"]): r["value"][1]
                       for r in prometheus(monitored, "up")}) != all_up and time.monotonic() < deadline:
        time.sleep(1)
    assert targets == all_up, f"{targets}{_alertmanager_said() if targets.get(('alertmanager', 'node1')) != '1' else ''}"
    memory = {r["metric"]["node"]: float(r["value"][1]) for r in prometheus(monitored, "node_memory_MemTotal_bytes")}
    assert set(memory) == {"node1", "node2"} and all(value > 0 for value in memory.values())
    expected = {r["metric"]["node"]: r["value"][1] for r in prometheus(monitored, "pycli_node_gpus_expected")}
    assert expected == {"node1": "0", "node2": "0"}  # no GPU here
    rules = {r["metric"]["alertname"] for r in prometheus(monitored, "ALERTS")}
    assert "NodeDown" not in rules, rules
    # Listening on the cluster network only, and the generated configuration passes promtool.
    assert node_get("node1", "http://127.0.0.1:9090/-/ready")[0] != 0
    # Alertmanager (whose API silences alerts) on node1 alone: no job on node2 reaches it.
    assert node_get("node1", "http://127.0.0.1:9093/-/ready")[0] == 0
    assert node_get("node2", f"http://{_address(monitored, 'node1')}:9093/-/ready")[0] != 0
    # Its configuration holds the webhook URL (often a token): not for every user of the node.
    code, out = node_run("node1", "stat", "-c", "%a %U %G", "/etc/prometheus/alertmanager.yml")
    assert out.split() == ["640", "root", "prometheus"], out
    code, out = node_run("node1", "promtool", "check", "config", "/etc/prometheus/prometheus.yml")
    assert code == 0 and "SUCCESS" in out, out
    for node in ("node1", "node2"):
        code, out = node_run(node, "ps", "-o", "rss=", "-C", "prometheus-node-exporter")
        print(f"node-exporter on {node}: {int(out.split()[0]) / 1024:.1f} MiB resident")
    # pycli top reads the same figures from Prometheus.
    frame = top_frame(monitored)
    assert frame["source"] == "prometheus" and frame["source_line"] == "Prometheus on node1", frame
    for node in frame["nodes"]:
        assert node["up"] and node["mem_total_bytes"] == memory[node["name"]], node
        assert 0 <= node["mem_used_bytes"] < node["mem_total_bytes"] and node["age_s"] < 3 * INTERVAL_S
    # A frozen node (the kernel answers TCP, nothing above it does: a hung driver looks so) is down
    # within the frame's timeout, its kept connection from the frame above included. Before, the
    # frame waited out that connection's keepalives: 72 s.
    with frozen("node2"):
        started = time.monotonic()
        frame = top_frame(monitored, "--timeout", "5")
        took = time.monotonic() - started
    print(f"\npycli top --once --timeout 5 with node2 frozen: {took:.1f} s")
    assert took < 5 + 10, f"pycli top took {took:.1f} s with node2 frozen, its --timeout 5"
    assert frame["source"] == "prometheus" and frame["nodes"][0]["up"], frame
    assert not frame["nodes"][1]["up"] and "no answer within 5 s" in frame["nodes"][1]["why"], frame["nodes"][1]
    again = run_pycli("provision", str(monitored), "--tags", "monitoring", timeout=1800)

    assert again.returncode == 0, again.stdout[-4000:]
    assert changed_tasks(_run_dir(again.stdout)) == [], again.stdout[-3000:]


def test_a_stopped_exporter_reaches_the_webhook_as_node_down_naming_the_node(monitored):
    for_s = NODE_DOWN_FOR_S  # the inventory's monitoring_alert_for, over the rules' 1m
    # The last scrape that finds it down, the rule's `for`, one evaluation, Alertmanager's group wait.
    bound = INTERVAL_S + for_s + INTERVAL_S + GROUP_WAIT_S
    assert node_run("node2", "systemctl", "stop", "prometheus-node-exporter")[0] == 0
    stopped = time.monotonic()
    try:
        firing = _wait_for_alert("NodeDown", "firing", "node2", timeout=bound + 60)
        took = time.monotonic() - stopped
        print(f"\nNodeDown for node2 reached the webhook {took:.0f} s after its exporter stopped "
              f"(for {for_s} s, scrape and evaluation every {INTERVAL_S} s, group wait {GROUP_WAIT_S} s)")
        assert took <= bound + 2 * INTERVAL_S, f"{took:.0f} s, more than {bound} s and two intervals"
        assert firing["labels"]["severity"] == "critical" and "node2" in firing["annotations"]["summary"]
        assert firing["annotations"]["summary"].endswith(f"has not answered for {NODE_DOWN_FOR_S} seconds"), firing
        # node2 itself still answers SSH; pycli top says what Prometheus sees.
        node2 = top_frame(monitored)["nodes"][1]
        assert not node2["up"] and node2["why"].startswith("Prometheus could not scrape it"), node2
    finally:
        node_run("node2", "systemctl", "start", "prometheus-node-exporter")
    _wait_for_alert("NodeDown", "resolved", "node2", timeout=120)


def _alertmanager_said() -> str:
    """Alertmanager's unit on node1 as systemd has it, and its last lines: for a failure's message
    (make test once found its target down and no alert at the webhook, and nothing said why)."""
    code, out = node_run("node1", "sh", "-c", "systemctl status --no-pager prometheus-alertmanager; "
                                              "journalctl --no-pager -n 40 -u prometheus-alertmanager")
    return f"\nAlertmanager on node1 (exit {code}):\n{out[-4000:]}"


def _wait_for_alert(name: str, status: str, node: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, out = node_run("node1", "cat", RECEIVED)
        for line in out.splitlines() if code == 0 else []:
            for alert in json.loads(line)["alerts"]:
                labels = alert["labels"]
                if (labels.get("alertname"), labels.get("node"), alert["status"]) == (name, node, status):
                    return alert
        time.sleep(1)
    raise AssertionError(f"no {status} {name} for {node} reached the webhook in {timeout:.0f} s:\n{out[-3000:]}"
                         + _alertmanager_said())
