"""`pycli top` on the session's provisioned 2-node cluster, over SSH (the inventory has no
monitoring host; tests/integration/test_monitoring.py reads it from Prometheus, and
test_node_down.py with node2 stopped): one frame as JSON and as text, and the live view in a
real terminal (tmux), its screen read back and Ctrl-C giving the prompt back."""

import json
import shutil
import subprocess
import time

import pytest

from tests.conftest import PYCLI, ROOT, run_pycli

pytestmark = pytest.mark.integration


def top_frame(inventory, *args: str) -> dict:
    proc = run_pycli("top", str(inventory), "--json", *args, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_one_frame_has_both_nodes_with_their_cpu_memory_and_network(provisioned_cluster):
    frame = top_frame(provisioned_cluster)
    assert frame["version"] == 1 and frame["source"] == "ssh" and frame["notes"] == []
    nodes = {node["name"]: node for node in frame["nodes"]}
    assert list(nodes) == ["node1", "node2"]
    for node in nodes.values():
        assert node["up"] and node["state"] in ("up", "idle"), node
        assert 0 <= node["cpu_pct"] <= 100 and 0 < node["mem_used_bytes"] < node["mem_total_bytes"]
        assert node["net_rx_bps"] >= 0 and node["gpus"] == [] and not node["gpu_error"]
    text = run_pycli("top", str(provisioned_cluster), "--once", timeout=120)
    assert text.returncode == 0, text.stderr
    rows = [line.split() for line in text.stdout.splitlines() if line.startswith(("node1 ", "node2 "))]
    assert [row[0] for row in rows] == ["node1", "node2"] and all(row[2].endswith("%") for row in rows), text.stdout
    assert "source: SSH, one round per refresh" in text.stdout


def test_the_live_view_in_a_terminal_refreshes_and_ctrl_c_gives_the_prompt_back(provisioned_cluster):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not on PATH: run `bash scripts/host-prereqs.sh` (as root) to install it", pytrace=False)
    session = f"pycli-top-{int(time.time())}"
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "180", "-y", "40", "bash --norc --noprofile"],
                   check=True, cwd=ROOT)
    try:
        command = " ".join([*PYCLI, "top", str(provisioned_cluster), "--interval", "1"])
        subprocess.run([*tmux, "send-keys", "-t", session, f"PS1='ready> '; {command}; echo top-ended-$?", "Enter"],
                       check=True)
        first = _screen_with(tmux, session, lambda s: "node1 " in s and "node2 " in s and "pycli top" in s)
        stamp = next(line for line in first.splitlines() if line.startswith("pycli top"))
        # It refreshes: the header's time moves on.
        _screen_with(tmux, session, lambda s: "node2 " in s and stamp not in s)
        subprocess.run([*tmux, "send-keys", "-t", session, "C-c"], check=True)
        after = _screen_with(tmux, session, lambda s: "top-ended-0" in s)
        assert "Traceback" not in after and after.rstrip().endswith("ready>"), after
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def _screen_with(tmux: list[str], session: str, wanted, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        if wanted(screen):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"the screen did not show what was awaited in {timeout:.0f} s:\n{screen}")
