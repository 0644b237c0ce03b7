"""The package cache's size, from the room its filesystem has (roles/package_cache/tasks/server.yml):
the shell that measures it run here, the role's expressions rendered by Ansible's own templating."""

from __future__ import annotations

import subprocess

import yaml

from tests.conftest import ROOT

ROLE = ROOT / "roles" / "package_cache"
TASKS = yaml.safe_load((ROLE / "tasks" / "server.yml").read_text())


def _task(name: str) -> dict:
    (task,) = [t for t in TASKS if t["name"] == name]
    return task


def _size(stdout: str, **settings) -> dict:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    task = _task("Size the cache from that room")
    variables = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()), **settings, "inventory_hostname": "node1",
                 "__package_cache_room": {"stdout": stdout}}
    variables.update({k: trust_as_template(v) for k, v in task["vars"].items()})
    templar = Templar(loader=DataLoader(), variables=variables)
    facts = {k: templar.template(trust_as_template(v)) for k, v in task["ansible.builtin.set_fact"].items()}
    check = _task("Check the cache's filesystem leaves it room enough")["ansible.builtin.assert"]
    templar = Templar(loader=DataLoader(), variables={**variables, **facts})
    facts["fits"] = templar.template(trust_as_template("{{ " + check["that"] + " }}"))
    facts["said"] = " ".join(templar.template(trust_as_template(check["fail_msg"])).split())
    return facts


def test_the_cache_takes_a_quarter_of_its_filesystem_s_room_at_most_and_never_more_than_its_maximum():
    # The launcher's /var: 40 GiB free, 2 GiB in the cache already. 100g would have filled it.
    assert int(_size("/var 40960 2048 0")["_package_cache_size_mb"]) == (40960 + 2048) // 4
    # A big disk: the maximum (100g) bounds it.
    assert int(_size("/var 4000000 0 0")["_package_cache_size_mb"]) == 102400


def test_a_second_run_keeps_the_size_while_the_free_space_moves_a_little():
    first = int(_size("/var 40960 2048 0")["_package_cache_size_mb"])
    assert int(_size(f"/var 40900 2100 {first}")["_package_cache_size_mb"]) == first  # a little less room: kept
    assert int(_size(f"/var 20000 2100 {first}")["_package_cache_size_mb"]) == (20000 + 2100) // 4  # half: smaller


def test_a_filesystem_without_room_for_the_least_cache_is_refused_with_the_figures():
    small = _size("/ 6000 0 0")
    assert small["fits"] is False and int(small["_package_cache_size_mb"]) == 1500
    assert small["said"].startswith("The package cache on node1 would get 1500 MiB:")
    assert "25% of the 6000 MiB its filesystem (/) has for it, below package_cache_min_size (2g)" in small["said"]
    assert _size("/var 40960 2048 0")["fits"] is True


def test_the_measuring_shell_reads_free_space_the_cache_s_own_and_the_size_configured(tmp_path):
    script = _task("Measure the room the cache's filesystem has for it")["ansible.builtin.shell"]["cmd"]
    cache, config = tmp_path / "cache" / "pycli-package-cache", tmp_path / "pycli-package-cache.conf"
    script = script.replace("{{ __package_cache_dir | quote }}", str(cache)).replace(
        "{{ __package_cache_config | quote }}", str(config))
    at, free, held, now = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert at == str(tmp_path) and int(free) > 0 and (held, now) == ("0", "0")  # first run: no folder, no config
    cache.mkdir(parents=True)
    (cache / "blob").write_bytes(b"x" * 3 * 1024 * 1024)
    config.write_text("proxy_cache_path /var/cache levels=1:2 keys_zone=pycli_packages:32m\n"
                      "                 max_size=10752m inactive=30d use_temp_path=off;\n")
    at, free, held, now = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert at == str(cache) and int(held) >= 3 and now == "10752"
