"""The check an apt repository's signing key passes before its keyring reaches a node.

roles/artifact_cache/files/apt_key.sh is what the docker and nvidia_container_toolkit roles
run on the controller; here it runs on keys made for the test (no network)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

APT_KEY = ROOT / "roles/artifact_cache/files/apt_key.sh"

pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--batch", "--no-options", *args], env={**os.environ, "GNUPGHOME": str(home)},
                          check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two keys, each with a subkey (whose fingerprint must not count as a key): armoured exports and fingerprints."""
    tmp = tmp_path_factory.mktemp("keys")
    home = tmp / "gnupg"
    home.mkdir(mode=0o700)
    made = {}
    for name in ("right", "other"):
        gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", "ed25519", "sign", "never")
        listing = gpg(home, "--with-colons", "--list-keys", f"{name}@example.invalid")
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        gpg(home, "--passphrase", "", "--quick-add-key", fingerprint, "cv25519", "encr", "never")
        armoured = tmp / f"{name}.asc"
        armoured.write_text(gpg(home, "--armor", "--export", fingerprint))
        made[name] = (armoured, fingerprint)
    both_in_one = tmp / "both-in-one-block.asc"
    both_in_one.write_text(gpg(home, "--armor", "--export", made["right"][1], made["other"][1]))
    made["both_in_one"] = (both_in_one, None)
    return made


def apt_key(keyfile: Path, fingerprint: str, keyring: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(APT_KEY), str(keyfile), fingerprint, str(keyring)],
                          capture_output=True, text=True, timeout=60)


def primary_fingerprints(keyring: Path) -> list[str]:
    listing = subprocess.run(["gpg", "--batch", "--with-colons", "--show-keys", str(keyring)],
                             env={**os.environ, "GNUPGHOME": str(keyring.parent)},
                             check=True, capture_output=True, text=True).stdout.splitlines()
    return [after.split(":")[9] for line, after in zip(listing, listing[1:]) if line.startswith("pub:")]


def test_the_right_key_alone_passes_and_becomes_the_keyring(keys, tmp_path):
    keyfile, fingerprint = keys["right"]
    keyring = tmp_path / "repo-keyring.gpg"
    run = apt_key(keyfile, fingerprint.lower(), keyring)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"updated {keyring}"
    assert primary_fingerprints(keyring) == [fingerprint]
    assert keyring.stat().st_mode & 0o777 == 0o644
    assert not keyring.read_bytes().startswith(b"-----BEGIN")


def test_a_second_run_leaves_the_keyring_alone(keys, tmp_path):
    keyfile, fingerprint = keys["right"]
    keyring = tmp_path / "repo-keyring.gpg"
    assert apt_key(keyfile, fingerprint, keyring).returncode == 0
    before = keyring.stat()
    run = apt_key(keyfile, fingerprint, keyring)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"unchanged {keyring}"
    assert keyring.stat().st_ino == before.st_ino and keyring.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo-keyring.gpg"]


def test_a_keyring_that_is_already_there_is_rebuilt_from_the_checked_key(keys, tmp_path):
    """A keyring left by an older key (or an older, looser check) does not outlive it."""
    keyfile, fingerprint = keys["right"]
    keyring = tmp_path / "repo-keyring.gpg"
    gpg(tmp_path, "--dearmor", "--output", str(keyring), str(keys["both_in_one"][0]))
    assert len(primary_fingerprints(keyring)) == 2
    run = apt_key(keyfile, fingerprint, keyring)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"updated {keyring}"
    assert primary_fingerprints(keyring) == [fingerprint]


@pytest.mark.parametrize("case", ["right key, another appended", "both keys in one block", "only another key"])
def test_a_key_file_with_more_or_other_keys_is_refused(keys, tmp_path, case):
    right, fingerprint = keys["right"]
    other, other_fingerprint = keys["other"]
    keyfile = tmp_path / "key.asc"
    keyfile.write_text({
        "right key, another appended": right.read_text() + other.read_text(),
        "both keys in one block": keys["both_in_one"][0].read_text(),
        "only another key": other.read_text(),
    }[case])
    keyring = tmp_path / "repo-keyring.gpg"
    keyring.write_bytes(b"the keyring a previous run installed")
    run = apt_key(keyfile, fingerprint, keyring)
    assert run.returncode == 1
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert fingerprint in line and other_fingerprint in line
    assert ("holds 2 keys" in line) if case != "only another key" else ("not the pinned" in line)
    assert keyring.read_bytes() == b"the keyring a previous run installed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.asc", "repo-keyring.gpg"]


@pytest.mark.parametrize("content, message", [
    ("not a key\n", "gpg cannot read it as a key"),
    (None, "is missing"),
])
def test_a_file_that_is_no_key_is_refused_in_one_line(keys, tmp_path, content, message):
    keyfile = tmp_path / "key.asc"
    if content is not None:
        keyfile.write_text(content)
    run = apt_key(keyfile, keys["right"][1], tmp_path / "repo-keyring.gpg")
    assert run.returncode == 1
    (line,) = run.stderr.splitlines()
    assert message in line
    assert not (tmp_path / "repo-keyring.gpg").exists()


def install_tasks(role: str, tasks_file: str = "install.yml") -> list[dict]:
    tasks = yaml.safe_load((ROOT / f"roles/{role}/tasks/{tasks_file}").read_text())
    flat = []
    for task in tasks:
        flat.extend(task.get("block", [task]))
    return flat


@pytest.mark.parametrize("role, tasks_file, signed_by", [
    ("docker", "install.yml", "/etc/apt/keyrings/docker.gpg"),
    ("nvidia_container_toolkit", "install.yml", "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"),
    ("nvidia_driver", "repository.yml", "/etc/apt/keyrings/cuda-archive-keyring.gpg"),
])
def test_each_repository_role_installs_the_keyring_the_check_wrote(role, tasks_file, signed_by):
    tasks = install_tasks(role, tasks_file)
    (check,) = [t for t in tasks if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "apt_key.yml"]
    assert check["ansible.builtin.include_role"]["name"] == "artifact_cache"
    (install,) = [t for t in tasks if t.get("ansible.builtin.copy", {}).get("dest") == signed_by]
    # nvidia_driver checks one key per distribution of the play (a loop); a host installs its own.
    loop_var = check.get("loop_control", {}).get("loop_var")
    keyring = check["vars"]["artifact_cache_keyring"]
    expected = keyring.replace(loop_var, "_nvidia_driver_repo_distro") if loop_var else keyring
    assert install["ansible.builtin.copy"]["src"] == expected
    sources = [t["ansible.builtin.copy"]["content"] for t in tasks if "Signed-By:" in str(t.get("ansible.builtin.copy", {}))]
    assert sources and all(f"Signed-By: {signed_by}\n" in s for s in sources)
    # No other gpg call decides what is trusted, and nothing is built only when missing.
    assert not [t for t in tasks if "gpg" in str(t.get("ansible.builtin.command", ""))]


def test_nvidia_cuda_repositories_are_pinned_to_nvidias_key_and_nothing_is_filled_in_by_hand():
    """Every distribution gpu_preflight_matrix lists has its CUDA repository key pinned by fingerprint in the
    role's defaults: a real GPU inventory needs no checksum or key of its own."""
    defaults = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())
    matrix = yaml.safe_load((ROOT / "roles/gpu_preflight/defaults/main.yml").read_text())["gpu_preflight_matrix"]
    distros = {d for row in matrix.values() for d in row["distros"]}
    keys = defaults["nvidia_driver_cuda_repo_keys"]
    assert distros <= set(keys)
    for distro in distros:
        assert keys[distro] == {"file": "3bf863cc.pub", "fingerprint": "EB693B3035CD5710E231E123A4B469963BF863CC"}, distro
    assert not [k for k in defaults if "sha256" in k or "keyring" in k]
    vars_files = {yaml.safe_load(p.read_text())["__nvidia_driver_repo_distro"]
                  for p in (ROOT / "roles/nvidia_driver/vars").glob("*.yml")}
    assert vars_files <= set(keys)
