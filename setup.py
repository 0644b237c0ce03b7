"""The wheel carries the tree pycli drives (PROJECT_TREE: the roles, the playbooks, their plugins, the
workloads, ansible.cfg and the host's set-up script) as package data under
pycli/_project, so that a pycli installed with pipx, `uv tool install` or pip runs from any folder.
In a checkout installed editable nothing is copied: pycli reads the same files in place
(pycli/core/tree.py). The metadata is all in pyproject.toml; this file only adds that step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# What pycli reads from its tree, relative to the checkout's root (the sdist takes the same: MANIFEST.in).
# collections/ names plugins/ as the collection pycli.cluster through a link: copied, the link becomes the folder.
PROJECT_TREE = ("ansible.cfg", "playbooks", "roles", "plugins", "collections", "workloads", "scripts/host-prereqs.sh")
BUNDLE = Path("pycli") / "_project"
LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")


class BuildWithTree(build_py):
    """build_py, then PROJECT_TREE copied into the built package (not for an editable install)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / BUNDLE
        shutil.rmtree(target, ignore_errors=True)
        for name in PROJECT_TREE:
            source, copy = HERE / name, target / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, copy, ignore=LEFT_OUT)
            else:
                shutil.copy2(source, copy)


setup(cmdclass={"build_py": BuildWithTree})
