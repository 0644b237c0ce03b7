"""The packages' layers (pyproject.toml [tool.importlinter], checked by make lint): the tree as it
is keeps them, and a change that climbs back up a layer, or pulls pycli into the node package,
fails the check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

NODE_FILES = Path("roles") / "pycli_node" / "files"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy(tmp_path: Path) -> Path:
    """The packages and their contracts, alone in a folder the check reads them from."""
    shutil.copytree(ROOT / "pycli", tmp_path / "pycli", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / NODE_FILES / "pycli_node", tmp_path / NODE_FILES / "pycli_node",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _check(tree: Path) -> subprocess.CompletedProcess[str]:
    # The copy comes first on the path: pycli's own (editable) install is found only after it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / NODE_FILES)])}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_its_layers(tmp_path):
    ran = _check(_copy(tmp_path))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 kept, 0 broken" in ran.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    # A lower layer importing a higher one.
    ("pycli/core/sizes.py", "from pycli.cli import app  # noqa", "pycli.core.sizes -> pycli.cli.app"),
    # Two packages of one layer importing each other.
    ("pycli/bench/stats.py", "import pycli.top.model  # noqa", "pycli.bench.stats -> pycli.top.model"),
    # The node package pulling in pycli.
    (f"{NODE_FILES}/pycli_node/gpu_reports.py", "import pycli.core.errors  # noqa",
     "pycli_node.gpu_reports -> pycli.core.errors"),
])
def test_an_import_across_the_layers_fails_the_check(tmp_path, module, line, broken):
    tree = _copy(tmp_path)
    _plant(tree, module, line)
    ran = _check(tree)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 broken" in ran.stdout and broken in ran.stdout, ran.stdout
