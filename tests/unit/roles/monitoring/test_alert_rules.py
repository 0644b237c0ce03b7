"""The alert rules of the monitoring role (roles/monitoring/files/alerts.yml) and their tests.

promtool checks the rule file and runs tests/promtool/alerts_test.yml, which feeds each alert
series that must fire it and series that must not. Beside that: every alert has both kinds of
test case, a severity and a one-line summary; the hardware Xids of GpuHardwareXid are those of
pycli_node.gpu_reports; and every DCGM field the rules read is one dcgm-exporter is told to export
(roles/monitoring/files/dcgm-counters.csv). promtool comes from scripts/host-prereqs.sh; without
it these tests fail, they never skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from pycli_node.gpu_reports import HARDWARE_XIDS
from tests.conftest import PLUGINS, ROOT

RULES = ROOT / "roles" / "monitoring" / "files" / "alerts.yml"
COUNTERS = ROOT / "roles" / "monitoring" / "files" / "dcgm-counters.csv"
RULE_TESTS = ROOT / "tests" / "promtool" / "alerts_test.yml"

SEVERITIES = {"critical", "warning"}
# Older names of DCGM fields that the rules read beside the current one (which the counters file
# lists): DCGM 3.3 renamed the clock throttle reasons to clock event reasons, same field.
OLDER_FIELD_NAMES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
DCGM_FIELD = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")
# An aggregation over GPUs (`count by (node) (...)`): its alert is about a node, not one GPU.
AGGREGATION = re.compile(r"\b(?:count|sum|min|max|avg|group)\s+by\b")
# `DCGM_FI_DEV_XID_ERRORS{...} == 48`: one hardware Xid of GpuHardwareXid.
XID_COMPARED = re.compile(r"DCGM_FI_DEV_XID_ERRORS(?:\{[^}]*\})?\s*==\s*(\d+)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not on PATH: run `bash scripts/host-prereqs.sh` (as root) to install it", pytrace=False)
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def rule_test_cases() -> list[dict]:
    """Every alert_rule_test entry of every test group: alertname, eval_time, exp_alerts."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return [case for group in tests for case in group.get("alert_rule_test") or []]


def counter_fields() -> list[str]:
    """The DCGM fields of the counters file's lines (`FIELD, type, help`), comments left out."""
    fields = []
    for number, line in enumerate(COUNTERS.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",", 2)]
        assert len(parts) == 3 and parts[1] in {"gauge", "counter"}, (
            f"dcgm-counters.csv:{number}: not `FIELD, gauge|counter, help`: {line}"
        )
        fields.append(parts[0])
    return fields


def test_promtool_accepts_the_rule_file():
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, f"promtool check rules failed:\n{proc.stdout}{proc.stderr}"


def test_every_promtool_rule_test_passes():
    proc = promtool("test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, f"promtool test rules failed:\n{proc.stdout}{proc.stderr}"


def test_every_alert_has_a_severity_a_one_line_summary_and_a_description():
    for rule in alert_rules():
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{name}: severity must be one of {sorted(SEVERITIES)}"
        summary = rule.get("annotations", {}).get("summary", "")
        assert summary.strip(), f"{name}: no summary"
        assert "\n" not in summary.strip(), f"{name}: the summary is more than one line"
        assert "{{ $labels.node }}" in summary, f"{name}: the summary does not name the node"
        assert rule["annotations"].get("description", "").strip(), f"{name}: no description (what to do)"


def test_the_summary_of_a_per_gpu_alert_names_the_gpu_index_and_uuid():
    # Per GPU: the rules over dcgm-exporter's series that keep their labels (GpuMissing counts per node).
    per_gpu = [rule for rule in alert_rules() if DCGM_FIELD.search(rule["expr"]) and not AGGREGATION.search(rule["expr"])]
    assert per_gpu
    for rule in per_gpu:
        summary = rule["annotations"]["summary"]
        assert "{{ $labels.gpu }}" in summary and "{{ $labels.UUID }}" in summary, f"{rule['alert']}: {summary}"


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_stays_quiet():
    cases = rule_test_cases()
    for name in sorted({rule["alert"] for rule in alert_rules()}):
        own = [case for case in cases if case["alertname"] == name]
        assert any(case.get("exp_alerts") for case in own), f"{name}: no case in {RULE_TESTS.name} where it fires"
        assert any(not case.get("exp_alerts") for case in own), f"{name}: no case in {RULE_TESTS.name} where it must not fire"


def test_every_severity_of_an_alert_fires_in_some_test_case():
    fired = {
        (case["alertname"], alert["exp_labels"].get("severity"))
        for case in rule_test_cases()
        for alert in case.get("exp_alerts") or []
    }
    for rule in alert_rules():
        key = (rule["alert"], rule["labels"]["severity"])
        assert key in fired, f"{key[0]} with severity {key[1]} fires in no test case ({RULE_TESTS.name})"


def test_the_hardware_xids_alerted_on_are_those_of_gpu_reports():
    rules = [rule for rule in alert_rules() if rule["alert"] == "GpuHardwareXid"]
    assert len(rules) == 1
    xids = [int(code) for code in XID_COMPARED.findall(rules[0]["expr"])]
    assert len(xids) == len(set(xids)), f"an Xid compared twice: {sorted(xids)}"
    assert set(xids) == set(HARDWARE_XIDS), (
        f"GpuHardwareXid: missing {sorted(set(HARDWARE_XIDS) - set(xids))}, extra {sorted(set(xids) - set(HARDWARE_XIDS))}"
        " (HARDWARE_XIDS in pycli_node.gpu_reports is the list)"
    )


def test_every_dcgm_field_the_rules_read_is_exported():
    fields = counter_fields()
    assert len(fields) == len(set(fields)), "a field listed twice in dcgm-counters.csv"
    used = set(DCGM_FIELD.findall(RULES.read_text()))
    assert used
    for name in sorted(used):
        current = OLDER_FIELD_NAMES.get(name, name)
        assert current in fields, f"{name} is read by alerts.yml but not exported: add {current} to dcgm-counters.csv"
    # One field under both its names would be watched twice.
    assert not set(fields) & set(OLDER_FIELD_NAMES), "dcgm-counters.csv lists a field by its older name"


def _alert_rules_filter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("alert_rules", PLUGINS / "filter" / "alert_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rule(text: str, name: str) -> dict:
    return next(rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"] if rule.get("alert") == name)


def test_a_site_s_for_replaces_the_rule_s_and_its_texts_say_the_new_time(tmp_path):
    """monitoring_alert_for: no override installs the file byte for byte; an override sets the
    rule's `for:` and the texts that say how long (\"for 1 minute\"), and promtool takes the result."""
    rules = _alert_rules_filter()
    text = RULES.read_text()
    assert rules.monitoring_alert_rules(text, {}) == text
    changed = rules.monitoring_alert_rules(text, {"NodeDown": "10s", "GpuIdleWhileJobHoldsIt": "1h30m"})
    node_down, idle = _rule(changed, "NodeDown"), _rule(changed, "GpuIdleWhileJobHoldsIt")
    assert node_down["for"] == "10s" and node_down["annotations"]["summary"].endswith("has not answered for 10 seconds")
    assert idle["for"] == "1h30m" and "idle for 1 hour 30 minutes while" in idle["annotations"]["summary"]
    assert "15 minutes" not in str(idle["annotations"])
    # Every other rule is as the file has it.
    for name in {rule["alert"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"]} - {
            "NodeDown", "GpuIdleWhileJobHoldsIt"}:
        assert _rule(changed, name) == _rule(text, name)
    written = tmp_path / "alerts.yml"
    written.write_text(changed)
    checked = promtool("check", "rules", str(written))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(("overrides", "said"), [
    ({"NodeDwn": "10s"}, "monitoring_alert_for names no alert of the role's rules: NodeDwn (its alerts: NodeDown, "),
    ({"NodeDown": "10x"}, "monitoring_alert_for: NodeDown's '10x' is not a Prometheus duration"),
    ({"NodeDown": 10}, "monitoring_alert_for: NodeDown's 10 is not a Prometheus duration"),
    (["NodeDown"], "monitoring_alert_for is ['NodeDown']: give a mapping of alert name to duration"),
])
def test_a_wrong_for_setting_is_refused_naming_it(overrides, said):
    with pytest.raises(ValueError) as refused:
        _alert_rules_filter().monitoring_alert_rules(RULES.read_text(), overrides)
    assert said in str(refused.value)
