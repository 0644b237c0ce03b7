"""pycli's wheel (setup.py, MANIFEST.in): it carries every file of the tree pycli drives, and an
installed pycli finds that tree in its package, not beside it. Built from a copy of the checkout's
tracked files (make test builds one from the checkout itself at the same time)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def _project_tree() -> tuple[str, ...]:
    """setup.py's PROJECT_TREE, read without running setup.py (its one home)."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        names = [target.id for target in getattr(node, "targets", []) if isinstance(target, ast.Name)]
        if isinstance(node, ast.Assign) and names == ["PROJECT_TREE"]:
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py names no PROJECT_TREE")


TREE = _project_tree()


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def _as_files(tracked: list[str]) -> list[str]:
    """The tracked names, a link to a folder (collections/ names plugins/ so) read as the files it leads to."""
    files = []
    for name in tracked:
        if (ROOT / name).is_symlink() and (ROOT / name).is_dir():
            target = (ROOT / name).resolve().relative_to(ROOT).as_posix()
            files += [name + other[len(target):] for other in tracked if other.startswith(target + "/")]
        else:
            files.append(name)
    return files


def test_the_wheel_carries_the_tree_pycli_drives_and_nothing_of_the_checkouts_own(tmp_path):
    source = tmp_path / "checkout"
    tracked = _tracked()
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name, follow_symlinks=False)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("pycli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"pycli/_project/{name}" for name in _as_files(tracked)
              if any(name == part or name.startswith(part + "/") for part in TREE) and "__pycache__" not in name}
    assert wanted and not wanted - names, sorted(wanted - names)[:20]
    assert "pycli/_project/playbooks/site.yml" in names and "pycli/_project/roles/slurm/tasks/main.yml" in names
    assert "pycli/_project/collections/ansible_collections/pycli/cluster/plugins/filter/cluster_address.py" in names
    carried = {name for name in names if name.startswith("pycli/_project/")}
    assert carried == wanted, sorted(carried - wanted)[:20]  # no tests, molecule, docs, bytecode
    assert "pycli_node/gpu_probe.py" in names and "pycli/cli/app.py" in names


def test_the_sdist_takes_the_same_tree():
    """MANIFEST.in names each part of PROJECT_TREE, so a wheel built from the sdist (uv) has it too."""
    named = {line.split()[1] for line in (ROOT / "MANIFEST.in").read_text().splitlines()
             if line.split()[:1] in (["include"], ["graft"])}
    assert named == set(TREE)


def test_an_installed_pycli_drives_the_tree_in_its_package(tmp_path):
    package = tmp_path / "site" / "pycli"
    shutil.copytree(ROOT / "pycli", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "_project" / "playbooks").mkdir(parents=True)
    asked = subprocess.run(
        [sys.executable, "-c", "from pycli.core.paths import PROJECT_ROOT, WORKLOADS_DIR\n"
                               "print(PROJECT_ROOT)\nprint(WORKLOADS_DIR)"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT / 'roles' / 'pycli_node' / 'files'}", "PATH": "/usr/bin:/bin"},
    )
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.split() == [str(package / "_project"), str(package / "_project" / "workloads")]


def test_a_checkout_drives_its_own_tree():
    from pycli.core.tree import PROJECT_ROOT

    assert PROJECT_ROOT == ROOT and not (ROOT / "pycli" / "_project").exists()
