"""pycli.local.dockerapi.run_in: a command in a node container, its exit code and all of its output.

The engine's command line is a stand-in here (a script named docker first on PATH), so what is
tested is what run_in makes of an answer: the integration tests run it against real nodes.
"""

import stat

import pytest

from pycli.core.errors import BadInput, PycliError
from pycli.local import dockerapi
from tests.conftest import ROOT


def _docker(tmp_path, monkeypatch, body: str) -> None:
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(script.parent))


def test_the_argv_reaches_docker_exec_word_for_word_and_both_streams_come_back(tmp_path, monkeypatch):
    _docker(tmp_path, monkeypatch, 'for a in "$@"; do echo "[$a]"; done; echo oops >&2; exit 3\n')
    code, output = dockerapi.run_in("pycli-x-node1", ["sh", "-c", "echo two words; exit 1"])
    assert code == 3
    assert output == "[exec]\n[pycli-x-node1]\n[sh]\n[-c]\n[echo two words; exit 1]\noops\n"


def test_no_docker_command_is_one_line_saying_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BadInput, match=rf"^the docker command is not installed; run 'sudo bash {ROOT}/scripts/host-prereqs.sh'$"):
        dockerapi.run_in("pycli-x-node1", ["true"])


def test_a_command_past_its_time_is_one_line_naming_it_and_the_container(tmp_path, monkeypatch):
    _docker(tmp_path, monkeypatch, "exec /bin/sleep 30\n")
    with pytest.raises(PycliError, match=r"^sleep 9 in pycli-x-node1 did not end within 1 s$"):
        dockerapi.run_in("pycli-x-node1", ["sleep", "9"], timeout_s=1)
