"""The Makefile's choice of Pythons (find_python, PYTHON, SECOND_PYTHON, test-pythons) on machines
that have different ones: a PATH made here holds the machine's tools but its Pythons, plus links
to the interpreters a case names, and pyenv is out of sight (PYENV_ROOT)."""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

HIDDEN = ("python", "python3", "pip", "pip3", "pydoc", "pydoc3", "python3-config")


def _interpreter(version: str) -> str | None:
    """A real interpreter of `version` on this machine, where there is one."""
    candidates = [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True)]
    for candidate in candidates:
        if Path(candidate).is_file() and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def _machine(tmp_path: Path, versions: tuple[str, ...]) -> dict[str, str]:
    """The environment of a machine whose only Pythons are `versions`."""
    found = {version: _interpreter(version) for version in versions}
    if missing := [version for version, path in found.items() if path is None]:
        pytest.skip(f"this machine has no Python {', '.join(missing)} to stand in with")
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for entry in Path(folder).iterdir():
            name = entry.name
            if name.startswith(("python", "pip", "pydoc")) or name in HIDDEN or (tools / name).exists():
                continue
            (tools / name).symlink_to(entry)
    for version, path in found.items():
        (tools / f"python{version}").symlink_to(path)
    return {"HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "no-pyenv"), "PATH": f"{tools}:/usr/sbin:/sbin"}


def _make(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def _chosen(env: dict[str, str]) -> tuple[str, str]:
    """(PYTHON's version, SECOND_PYTHON's version) as the Makefile chooses them."""
    out = _make(env, "-s", "--eval", "show-pythons: ; @echo $(PYTHON_VERSION) $(SECOND_VERSION)", "show-pythons").stdout.split()
    return out[0], out[1]


@pytest.mark.parametrize(("versions", "main", "second"), [
    (("3.11", "3.13"), "3.11", "3.13"),  # Debian 12 with a second Python
    (("3.12", "3.13"), "3.13", "3.12"),  # no 3.11: the newest for .venv
    (("3.13",), "3.13", "3.13"),  # Debian 13: one Python
])
def test_make_test_takes_311_where_there_is_one_and_another_version_beside_it(tmp_path, versions, main, second):
    env = _machine(tmp_path, versions)
    assert _chosen(env) == (main, second)
    checked = _make(env, "test-pythons", f"VENV={tmp_path / 'no-venv'}")
    assert checked.returncode == 0, checked.stderr
    one_python = "the second Python is 3.13 too" in checked.stdout
    assert one_python == (main == second), checked.stdout


def test_a_machine_without_a_supported_python_is_told_in_one_line(tmp_path):
    env = _machine(tmp_path, ())
    checked = _make(env, "test-pythons")
    assert checked.returncode == 2
    assert "make test: no supported Python (one of 3.11 3.12 3.13) answers here" in checked.stderr, checked.stderr
