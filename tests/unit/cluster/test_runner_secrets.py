"""What a run folder keeps: no secret of the controller's environment, no extra var value.

The last two tests run Ansible for real against this machine (`ansible_connection=local`, a
few seconds each): ansible-runner writes the environment and command line it used into the
run folder, so only a real run shows what lands there.
"""

import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path, PurePosixPath

import pytest

from pycli.cluster import runner
from pycli.cluster.model import Host
from pycli.cluster.runner import RunRequest, confine_env, mask_url_credentials
from pycli.core.paths import new_run_dir
from pycli.core.tree import PROJECT_ROOT
from pycli.jobs import containers

CONTROLLER_SECRET = "fake-secret-1234"
EXTRA_SECRET = "extra-secret-5678"
DOCKER_SECRET = "docker-secret-9012"


def _local_inventory(tmp_path: Path) -> Path:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[nodes]\nnode1 ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return inventory


def _files_holding(folder: Path, *secrets: str) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path.relative_to(folder)}: {s}" for s in secrets if s.encode() in data]
    return found


def test_ansible_sees_the_allow_list_and_what_pycli_and_ansible_runner_set():
    controller = {"PATH": "/bin", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "s", "LC_ALL": "C", "ANSIBLE_FORKS": "9",
                  "PYCLI_CACHE": "/c", "https_proxy": "http://p:3128", "GITHUB_TOKEN": "t", "AWX_ISOLATED_DATA_DIR": "/old"}
    prepared = {**controller, "PATH": "/venv/bin:/bin", "ANSIBLE_STDOUT_CALLBACK": "awx_display",
                "AWX_ISOLATED_DATA_DIR": "/run/artifacts/x", "RUNNER_OMIT_EVENTS": "False"}
    assert confine_env(prepared, controller) == {
        "PATH": "/venv/bin:/bin", "HOME": "/root", "LC_ALL": "C", "ANSIBLE_FORKS": "9", "PYCLI_CACHE": "/c",
        "https_proxy": "http://p:3128", "ANSIBLE_STDOUT_CALLBACK": "awx_display",
        "AWX_ISOLATED_DATA_DIR": "/run/artifacts/x", "RUNNER_OMIT_EVENTS": "False",
    }


def test_extra_vars_go_by_a_file_not_on_the_command_line(tmp_path):
    request = RunRequest(inventory=tmp_path / "hosts.ini", module="ping", extravars={"token": EXTRA_SECRET})
    kwargs = request.runner_kwargs(tmp_path / "run", extravars_file=tmp_path / "vars.json")
    assert "extravars" not in kwargs and kwargs["suppress_env_files"] is True
    assert kwargs["cmdline"] == f"-e @{tmp_path / 'vars.json'}"
    assert EXTRA_SECRET not in repr(kwargs)


def test_run_folders_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCLI_RUNS", str(tmp_path / "runs"))
    folder = new_run_dir("provision")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temp folder of this test's own, where the run writes its private files: runs beside
    it (the suite's integration tests) hold theirs in the shared one while they run."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.slow_ansible
def test_a_real_run_keeps_secrets_out_of_its_folder(tmp_path, monkeypatch, private_tmp):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CONTROLLER_SECRET)
    run_dir = tmp_path / "run"
    request = RunRequest(inventory=_local_inventory(tmp_path), module="ansible.builtin.ping", extravars={"token": EXTRA_SECRET})
    result = runner.run(request, run_dir)
    assert result.status == "successful" and result.hosts["node1"].ok == 1
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert not _files_holding(run_dir, CONTROLLER_SECRET, EXTRA_SECRET)
    assert (run_dir / "artifacts").is_dir()  # the run folder was written, and searched
    assert not list(private_tmp.glob("pycli-extravars-*"))


@pytest.mark.slow_ansible
def test_docker_opt_env_values_stay_out_of_the_run_folder(tmp_path, monkeypatch):
    # A stand-in `docker` answers the job-container playbook the way a node's Docker would.
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "docker").write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  version) echo 27.0.0 ;;\n"
        "  run) echo 0123456789ab ;;\n"
        "  inspect) echo true ;;\n"
        "  logs) echo 'Server listening on 0.0.0.0 port 2299.' ;;\n"
        "esac\n"
    )
    (tools / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    hosts = (Host("node1", "127.0.0.1"),)
    container = containers.parse_job_container("img:1", 2299, [f"-e TOKEN={DOCKER_SECRET} --env=OTHER={DOCKER_SECRET}"], hosts)
    work = PurePosixPath(str(tmp_path / "work"))
    containers.write_container_files(tmp_path / "work" / "jobs" / "j1" / "container", hosts, container, "j1",
                                     slurm=False)  # as staged
    request = RunRequest(
        inventory=_local_inventory(tmp_path), playbook=PROJECT_ROOT / "playbooks" / "job_container.yml",
        extravars=containers.playbook_vars(container, "j1", work / "jobs" / "j1", work, "started"),
    )
    result = runner.run(request, tmp_path / "run")
    assert result.status == "successful", result.hosts
    assert not _files_holding(tmp_path / "run", DOCKER_SECRET)


# Credentials in the URLs of variables ENV_ALLOWED passes (a mirror's token, a proxy's password).
URL_SECRETS = {
    "PIP_INDEX_URL": ("https://user:s3cret-index@pypi.example/simple", "s3cret-index"),
    "PIP_EXTRA_INDEX_URL": ("https://__token__:tok-extra-4711@one.example/simple https://tok-bare-0815@two.example/simple",
                            "tok-extra-4711", "tok-bare-0815"),
    "https_proxy": ("http://bob:hunter2-proxy@proxy:3128", "hunter2-proxy"),
}


@pytest.mark.slow_ansible
def test_credentials_in_urls_reach_ansible_but_not_the_run_folder(tmp_path, monkeypatch, private_tmp):
    checks = []
    for name, (value, *_) in URL_SECRETS.items():
        monkeypatch.setenv(name, value)
        # The play compares digests, so neither it nor its events hold a secret.
        checks.append(f"lookup('env', '{name}') | hash('sha256') == '{hashlib.sha256(value.encode()).hexdigest()}'")
    playbook = tmp_path / "env.yml"
    playbook.write_text(
        # Facts too: a local host's ansible_env is the controller's environment, real values and all.
        "- hosts: nodes\n  gather_facts: true\n  tasks:\n"
        "    - ansible.builtin.assert:\n        that:\n" + "".join(f"          - \"{check}\"\n" for check in checks)
        + "    - ansible.builtin.shell: test \"$(printf %s \"$https_proxy\" | sha256sum | cut -d' ' -f1)\" = "
        + hashlib.sha256(URL_SECRETS["https_proxy"][0].encode()).hexdigest() + "\n"
    )
    run_dir = tmp_path / "run"
    result = runner.run(RunRequest(inventory=_local_inventory(tmp_path), playbook=playbook), run_dir)
    assert result.status == "successful" and result.hosts["node1"].ok == 3, result.hosts
    secrets = [secret for _, *found in URL_SECRETS.values() for secret in found]
    assert not _files_holding(run_dir, *secrets)
    command = json.loads(next(run_dir.glob("artifacts/*/command")).read_text())
    assert command["env"]["https_proxy"] == "http://bob:***@proxy:3128"  # recorded, masked
    assert not list(private_tmp.glob("pycli-env-*"))


def test_masking_hides_the_password_or_the_lone_token_of_every_url():
    assert mask_url_credentials("http://bob:hunter2@proxy:3128") == "http://bob:***@proxy:3128"
    assert mask_url_credentials("https://tok@a.example/simple https://u:p@b.example/x?y=1") == (
        "https://***@a.example/simple https://u:***@b.example/x?y=1")
    assert mask_url_credentials("http://bob:p@ss@proxy/") == "http://bob:***@proxy/"  # an unquoted @ in the password
    for plain in ("http://proxy:3128", "/usr/bin:/bin", "mail me at a@b.example", "localhost,.example,10.0.0.0/8", ""):
        assert mask_url_credentials(plain) == plain
