"""Which hosts the package cache fetches from (plugins/filter/package_cache_repositories.py),
and the role's expression that gathers them, rendered by Ansible's own templating."""

from __future__ import annotations

import importlib.util

import yaml

from tests.conftest import PLUGINS, ROOT, ansible_plugins

ROLE = ROOT / "roles" / "package_cache"
_spec = importlib.util.spec_from_file_location("package_cache_repositories",
                                               PLUGINS / "filter" / "package_cache_repositories.py")
repos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repos)

SOURCES = """\
# deb http://commented.example.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/docker.gpg] http://HTTPS///download.docker.com/linux/debian bookworm stable
deb http://Deb.Debian.org/debian bookworm main  # the mirror
Types: deb
URIs: http://deb.debian.org/debian-security https://mirror.example.net./debian
Suites: bookworm-security
"""


def test_the_hosts_of_one_line_and_deb822_sources_are_read_and_comments_left_out():
    urls = repos.package_cache_source_urls(SOURCES)
    assert repos.package_cache_repository_hosts(urls) == ["deb.debian.org", "download.docker.com", "mirror.example.net"]


def test_loopback_link_local_and_unspecified_addresses_are_never_served():
    refused = ["127.0.0.1", "127.8.0.1", "169.254.169.254", "::1", "fe80::1", "0.0.0.0", "localhost", "x.localhost",
               "http://169.254.169.254/latest/", "http://[::1]:80/"]
    assert repos.package_cache_refused(refused) == refused
    assert repos.package_cache_refused(["10.0.0.5", "172.28.0.2", "deb.debian.org", "2001:db8::1", "http://10.1.1.1/"]) == []
    assert repos.package_cache_repository_hosts(
        ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:3142/", "http://[::1]/", "10.0.0.5"]) == ["10.0.0.5"]


def _role_repositories(**inventory) -> list[str]:
    """__package_cache_role_repositories as the cache host's play sees it: role apt_repositories's
    defaults (its dependency), the inventory's settings over them."""
    shared = yaml.safe_load((ROLE.parent / "apt_repositories" / "defaults" / "main.yml").read_text())
    listed = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__package_cache_role_repositories"]
    return [_render(item, {**shared, **inventory}) for item in listed]


def test_each_role_s_repository_comes_from_the_inventory_or_else_from_role_apt_repositories():
    assert repos.package_cache_repository_hosts(_role_repositories()) == [
        "developer.download.nvidia.com", "download.docker.com", "nvidia.github.io"]
    # A site's own Docker mirror in the inventory takes the place of Docker's.
    site = repos.package_cache_repository_hosts(_role_repositories(docker_repo_base_url="https://mirror.site/docker"))
    assert "mirror.site" in site and "download.docker.com" not in site


def test_every_repository_a_role_writes_is_one_the_cache_serves():
    """A role that adds an apt repository takes its URL from role apt_repositories and its setting is
    one the cache reads, or its downloads are refused by the cache."""
    listed = " ".join(yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__package_cache_role_repositories"])
    shared = yaml.safe_load((ROLE.parent / "apt_repositories" / "defaults" / "main.yml").read_text())
    written = {}
    for defaults in ROLE.parent.glob("*/defaults/main.yml"):
        for key, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if key.endswith("_repo_url") or key.endswith("_repo_base_url"):
                written[key] = str(value)
    assert sorted(written) == ["docker_repo_base_url", "nvidia_container_toolkit_repo_url", "nvidia_driver_cuda_repo_base_url"]
    for key, value in written.items():
        (default,) = [name for name in shared if value == "{{ " + name + " }}"]
        assert f"{key} | default({default})" in listed, key


def _render(expression: str, variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    ansible_plugins()
    def trusted(value):  # the role's own files' values are templates, as Ansible trusts them
        if isinstance(value, str):
            return trust_as_template(value)
        return [trusted(item) for item in value] if isinstance(value, list) else value

    variables = {k: trusted(v) for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def test_the_cache_serves_the_sources_of_this_run_s_hosts_the_roles_and_the_site_s_and_keeps_an_unreached_node_s():
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    server = yaml.safe_load((ROLE / "tasks" / "server.yml").read_text())
    (know,) = [t for t in server if t["name"] == "Know the repositories the cache serves"]
    node1 = {"__package_cache_sources": {"stdout": SOURCES}}
    node2 = {"__package_cache_sources": {"stdout": "deb http://ftp.de.debian.org/debian bookworm main\n"}}

    def serves(play_hosts: list[str], served_now: str) -> list[str]:
        hostvars = {"node1": node1, "node2": node2}
        shared = yaml.safe_load((ROLE.parent / "apt_repositories" / "defaults" / "main.yml").read_text())
        variables = {**shared, **role_vars, "package_cache_repositories": ["10.1.2.3"], "package_cache_nodes_group": "nodes",
                     "groups": {"nodes": ["node1", "node2"]}, "ansible_play_hosts": play_hosts,
                     "hostvars": hostvars, "inventory_hostname": "node1",
                     "__package_cache_served": served_now}
        variables.update(know["vars"])
        return _render(know["ansible.builtin.set_fact"]["_package_cache_repositories"], variables)

    def config(hosts: list[str]) -> dict:  # what slurp gives of the cache's configuration
        text = f"# Managed by pycli (package_cache).\n# repositories: {' '.join(hosts)}\nproxy_cache_path x;\n"
        return {"content": __import__("base64").b64encode(text.encode()).decode()}


    first_run = {"failed": False, "msg": "File not found: /etc/nginx/conf.d/pycli-package-cache.conf"}
    both = serves(["node1", "node2"], first_run)
    assert both == ["10.1.2.3", "deb.debian.org", "developer.download.nvidia.com", "download.docker.com",
                    "ftp.de.debian.org", "mirror.example.net", "nvidia.github.io"]
    # node2 not reached: its mirror stays, as the configuration served it.
    assert serves(["node1"], config(both)) == both
    # Every node reached: what no source names any more is no longer served.
    assert "old.mirror.org" not in serves(["node1", "node2"], config(["old.mirror.org", *both]))


def test_a_site_that_lists_the_metadata_address_is_refused_in_one_line():
    server = yaml.safe_load((ROLE / "tasks" / "server.yml").read_text())
    (check,) = [t for t in server if t["name"].startswith("Check the site's repositories")]
    variables = {"package_cache_repositories": ["mirror.site", "http://169.254.169.254/"]}
    variables.update(check["vars"])
    assert _render("{{ " + check["ansible.builtin.assert"]["that"] + " }}", variables) is False
    said = " ".join(_render(check["ansible.builtin.assert"]["fail_msg"], variables).split())
    assert said.startswith("package_cache_repositories names http://169.254.169.254/: the cache never fetches"), said
    assert _render("{{ " + check["ansible.builtin.assert"]["that"] + " }}",
                   {**variables, "package_cache_repositories": ["mirror.site"]}) is True


def test_a_configuration_the_cache_host_cannot_read_stops_the_run_and_none_yet_does_not():
    """Taken for an empty one, it would stop serving the repositories of the nodes a run did not reach."""
    server = yaml.safe_load((ROLE / "tasks" / "server.yml").read_text())
    (read,) = [t for t in server if t["name"] == "Read the repositories the cache serves now"]

    def fails(answer: dict) -> bool:
        return _render("{{ " + read["failed_when"] + " }}", {"__package_cache_served": answer})

    assert fails({"failed": True, "msg": "Permission denied: /etc/nginx/conf.d/pycli-package-cache.conf"}) is True
    assert fails({"failed": False, "msg": "File not found: /etc/nginx/conf.d/pycli-package-cache.conf"}) is False
    assert fails({"content": "IyByZXBvc2l0b3JpZXM6IGEK", "encoding": "base64"}) is False
