"""Every apt task of the roles that trusts a recent refresh (cache_valid_time) first looks for lists.

apt's cache_valid_time reads the age of /var/lib/apt/lists; a freshly imaged node (a cloud image,
or the local cluster's node image an hour old) has that folder empty with a new mtime, and apt
then takes it for a fresh cache and finds no package. Each such task therefore sets the time from
a `find` of the lists, 0 when there are none."""

import yaml

from tests.conftest import ROOT


def apt_tasks():
    for tasks_file in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        for task in yaml.safe_load(tasks_file.read_text()) or []:
            for nested in [task, *task.get("block", []), *task.get("rescue", []), *task.get("always", [])]:
                module = nested.get("ansible.builtin.apt")
                if isinstance(module, dict):
                    yield tasks_file.relative_to(ROOT), nested["name"], module


def test_the_roles_have_apt_tasks_to_check():
    assert sum(1 for _, _, module in apt_tasks() if "cache_valid_time" in module) >= 3


def test_a_cache_valid_time_is_zero_where_the_node_has_no_lists():
    for path, name, module in apt_tasks():
        if "cache_valid_time" not in module:
            continue
        valid = str(module["cache_valid_time"])
        assert ".matched > 0 else 0" in valid, (
            f"{path}: '{name}' sets cache_valid_time {valid!r}: on a freshly imaged node with an empty, new "
            "/var/lib/apt/lists it refreshes nothing; take it from a find of the lists (0 when none)")
