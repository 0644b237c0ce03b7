"""What the controller downloads runs no code before its checksum is checked.

`pip download` of an sdist prepares its metadata, which runs the sdist's setup.py on the
controller before anything compares the file with its pinned sha256. So pip only ever
fetches wheels (--only-binary=:all:), and the Horovod sdist is a plain HTTP download that
get_url checks against its sha256 before moving it into the cache."""

import pytest
import yaml

from tests.conftest import ROOT

TASK_FILES = sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("playbooks/*.yml")])


def tasks_in(node) -> list[dict]:
    """Every task in a task file or playbook, inside blocks and plays too."""
    found = []
    if isinstance(node, list):
        for item in node:
            found.extend(tasks_in(item))
    elif isinstance(node, dict):
        children = [node[k] for k in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers") if k in node]
        if children:
            for child in children:
                found.extend(tasks_in(child))
        else:
            found.append(node)
    return found


def commands(task: dict) -> list[str]:
    """The command line of a command or shell task as one string (argv may be a Jinja expression)."""
    lines = []
    for module in ("ansible.builtin.command", "ansible.builtin.shell", "command", "shell"):
        if module in task:
            args = task[module]
            lines.append(" ".join(map(str, args["argv"])) if isinstance(args, dict) and isinstance(args.get("argv"), list)
                         else str(args.get("argv", args.get("cmd", "")) if isinstance(args, dict) else args))
    return lines


def pip_downloads() -> list[tuple[str, str]]:
    found = []
    for path in TASK_FILES:
        for task in tasks_in(yaml.safe_load(path.read_text())):
            for line in commands(task):
                if "pip" in line and "download" in line:
                    found.append((f"{path.relative_to(ROOT)}: {task.get('name')}", line))
    return found


def test_there_are_pip_downloads_to_check():
    assert pip_downloads(), "the scan found no pip download: has the way tasks are written changed?"


@pytest.mark.parametrize("where, line", pip_downloads(), ids=[w for w, _ in pip_downloads()])
def test_pip_downloads_fetch_wheels_only(where, line):
    assert "--no-binary" not in line
    assert "--only-binary=:all:" in line


def test_the_horovod_sdist_is_fetched_by_url_against_its_sha256():
    tasks = tasks_in(yaml.safe_load((ROOT / "roles/horovod/tasks/download.yml").read_text()))
    fetches = [t["ansible.builtin.get_url"] for t in tasks if "ansible.builtin.get_url" in t]
    assert [f for f in fetches if f["dest"] == "{{ __horovod_sdist }}"] == fetches and len(fetches) == 1
    (fetch,) = fetches
    assert fetch["url"] == "{{ horovod_sdist_url }}"
    assert fetch["checksum"] == "sha256:{{ horovod_sdist_sha256 }}"
    defaults = yaml.safe_load((ROOT / "roles/horovod/defaults/main.yml").read_text())
    assert defaults["horovod_sdist_url"].startswith("https://")
    assert defaults["horovod_sdist_url"].endswith("/horovod-{{ horovod_version }}.tar.gz") or \
        defaults["horovod_sdist_url"].endswith(f"/horovod-{defaults['horovod_version']}.tar.gz")
