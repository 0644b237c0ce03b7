"""roles/ssh_trust/files/verify-peers.sh, the one task in which a node checks its logins to
its peers: run here with bash, through an `ssh` stand-in that answers as the peers would (a
node's hostname, a busy sshd's dropped connection, a refused key)."""

import subprocess

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "roles" / "ssh_trust" / "files" / "verify-peers.sh"


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """`ssh ... -- TARGET hostname`: answers from tmp_path/answers/TARGET ("hostname", or
    "drop N" for N busy-sshd resets before it answers, or "deny"); logs every target."""
    bin_dir = tmp_path / "bin"
    (tmp_path / "answers").mkdir()
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"""#!/bin/bash
target=${{@: -2:1}}
echo "$target" >> {tmp_path}/calls
answer=$(cat {tmp_path}/answers/"$target" 2>/dev/null) || {{ echo "ssh: Could not resolve hostname $target" >&2; exit 255; }}
case $answer in
    drop\\ *)
        left=${{answer#drop }}; left=${{left%% *}}
        if [ "$left" -gt 0 ]; then
            echo "drop $((left - 1)) ${{answer##* }}" > {tmp_path}/answers/"$target"
            echo "kex_exchange_identification: read: Connection reset by peer" >&2; exit 255
        fi ;;
    deny) echo "$target: Permission denied (publickey)." >&2; exit 255 ;;
esac
echo "${{answer##* }}"
""")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def answer(target: str, text: str) -> None:
        (tmp_path / "answers" / target).write_text(text)

    def calls() -> list[str]:
        log = tmp_path / "calls"
        return log.read_text().split() if log.exists() else []

    return answer, calls


def peers(count: int) -> list[str]:
    return [f"node{i}=10.0.0.{i}=host{i}" for i in range(1, count + 1)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def healthy(answer, count: int) -> None:
    for i in range(1, count + 1):
        answer(f"node{i}", f"host{i}")
        answer(f"10.0.0.{i}", f"host{i}")


def test_every_peer_by_name_and_address_from_this_node_s_place_in_the_ring(fake_ssh):
    answer, calls = fake_ssh
    healthy(answer, 3)
    done = run("1", "2", "1", "all", *peers(3))
    assert done.returncode == 0, done.stderr
    # One login at a time here: node2's ring starts at itself, then node3, then node1.
    assert calls() == ["node2", "10.0.0.2", "node3", "10.0.0.3", "node1", "10.0.0.1"]
    assert done.stdout.split("\n").count("ok node3") == 1 and "FAIL" not in done.stdout


def test_exactly_the_pairs_that_fail_are_named_and_only_dropped_logins_are_tried_again(fake_ssh):
    answer, calls = fake_ssh
    healthy(answer, 3)
    answer("node3", "deny")
    answer("10.0.0.3", "deny")
    answer("node1", "drop 1 host1")  # a busy sshd drops the first login, the second gets in
    answer("10.0.0.2", "host9")  # the address reaches another machine
    done = run("4", "2", "0", "all", *peers(3))
    assert done.returncode == 1
    failed = sorted(line for line in done.stderr.splitlines() if line.startswith("FAIL"))
    assert failed == ["FAIL 10.0.0.2: answered 'host9', not 'host2'",
                      "FAIL 10.0.0.3: 10.0.0.3: Permission denied (publickey).",
                      "FAIL node3: node3: Permission denied (publickey)."]
    assert calls().count("node1") == 2 and calls().count("node3") == 1  # a refused key is not tried again


def test_a_login_dropped_every_time_fails_after_its_attempts(fake_ssh):
    answer, calls = fake_ssh
    healthy(answer, 1)
    answer("node1", "drop 9 host1")
    done = run("1", "2", "0", "all", *peers(1))
    assert done.returncode == 1 and "FAIL node1: kex_exchange_identification" in done.stderr
    assert calls().count("node1") == 2


def test_past_the_threshold_a_node_checks_itself_its_next_peers_and_a_sample(fake_ssh):
    answer, calls = fake_ssh
    healthy(answer, 10)
    done = run("4", "1", "8", "2,3", *peers(10))
    assert done.returncode == 0, done.stderr
    names = [target for target in calls() if target.startswith("node")]
    assert len(names) == len(set(names)) == 6  # itself, the next two (wrapping round), three others
    assert {"node9", "node10", "node1"} <= set(names)
    assert len([t for t in calls() if t.startswith("10.")]) == 6


@pytest.mark.parametrize("args", [(), ("x", "1", "0", "all", "a=b=c"), ("1", "1", "5", "all", "a=b=c"),
                                  ("1", "1", "0", "some", "a=b=c")])
def test_bad_arguments_exit_2(args):
    assert run(*args).returncode == 2
