from pathlib import Path

import pytest

from pycli.core.errors import BadInput
from pycli.local.image import ImageSpec
from tests.conftest import ROOT

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_tag_is_stable_and_changes_with_every_input(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    base = ImageSpec()
    assert base.tag == ImageSpec().tag and base.tag.startswith("pycli-node:bookworm-")
    assert ImageSpec(mirror="http://mirror.example/debian").tag != base.tag
    with_ca = ImageSpec(ca_bundle=ca).tag
    assert with_ca != base.tag
    ca.write_text(PEM + PEM)
    assert ImageSpec(ca_bundle=ca).tag != with_ca


def test_security_mirror_sits_beside_the_main_archive():
    assert ImageSpec(mirror="http://deb.debian.org/debian/").security_mirror == "http://deb.debian.org/debian-security"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ImageSpec(suite="sid"), "not supported"),
        (ImageSpec(mirror="ftp://x/debian"), "not an http"),
        (ImageSpec(ca_bundle=Path("/nonexistent/ca.pem")), "cannot read CA bundle"),
    ],
)
def test_bad_image_inputs_are_refused(spec, message):
    with pytest.raises(BadInput, match=message):
        spec.validate()


def test_a_ca_bundle_without_certificates_is_refused(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(BadInput, match="no PEM certificate"):
        ImageSpec(ca_bundle=junk).validate()


# Building the image: debootstrap always checks the Release signature against Debian's keyring.

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def argv_run_by_debootstrap(monkeypatch, tmp_path) -> list[str]:
    """The argv pycli runs debootstrap with, caught instead of run."""
    from pycli.local import image as local_image

    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "cache"))
    ran = []
    monkeypatch.setattr(local_image, "_run", lambda argv, what, log=None: ran.append(argv))
    local_image._debootstrap(ImageSpec(mirror="http://mirror.example/debian"), tmp_path / "rootfs", tmp_path / "log")
    (argv,) = ran
    return argv


def test_debootstrap_checks_the_release_signature_against_debians_keyring(monkeypatch, tmp_path):
    argv = argv_run_by_debootstrap(monkeypatch, tmp_path)
    assert argv[0] == "debootstrap"
    assert [a for a in argv if a.startswith(("--keyring", "--no-check", "--extra-keyring"))] == [f"--keyring={KEYRING}"]
    # Options come before the suite, target and mirror.
    assert argv[-3:] == ["bookworm", str(tmp_path / "rootfs"), "http://mirror.example/debian"]
    assert argv.index(f"--keyring={KEYRING}") < len(argv) - 3


def cannot_build_for_want_of_the_keyring(monkeypatch, tmp_path):
    """Root, debootstrap present, no image yet, but no Debian archive keyring."""
    from docker.errors import ImageNotFound

    from pycli.local import dockerapi
    from pycli.local import image as local_image

    class Images:
        def get(self, tag):
            raise ImageNotFound(tag)

    class Client:
        images = Images()

    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(local_image.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_image.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(local_image, "DEBIAN_ARCHIVE_KEYRING", tmp_path / "no-such-keyring.gpg")
    monkeypatch.setattr(dockerapi, "connect", lambda: Client())
    ran = []
    monkeypatch.setattr(local_image, "_run", lambda argv, what, log=None: ran.append(argv))
    return ran


def test_a_missing_debian_keyring_stops_the_build_in_one_line(monkeypatch, tmp_path, capsys):
    from pycli.cli.app import main

    ran = cannot_build_for_want_of_the_keyring(monkeypatch, tmp_path)
    assert main(["cluster", "image"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycli: error: ") and err.count("\n") == 1
    assert str(tmp_path / "no-such-keyring.gpg") in err
    assert "install debian-archive-keyring" in err and "host-prereqs.sh" in err
    assert ran == [] and not (tmp_path / "cache" / "debootstrap").exists()


def test_host_prereqs_installs_the_debian_keyring(tmp_path):
    """On an Ubuntu controller debootstrap comes without Debian's keyring: host-prereqs.sh adds it.

    Runs a copy of the script with stand-ins for the commands it calls, where the keyring pycli
    checks for (named once in the script) is a path that does not exist."""
    import subprocess

    text = (ROOT / "scripts/host-prereqs.sh").read_text()
    assert text.count(KEYRING) == 1
    script = tmp_path / "host-prereqs.sh"
    script.write_text(text.replace(KEYRING, str(tmp_path / "no-such-keyring.gpg")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    stubs = {
        "id": "echo 0",
        "apt-get": f'echo "$*" >>{log}',
        "dockerd": "echo 'Docker version 20.10'",
        "debootstrap": "exit 0",
        "docker": "echo 20.10",
        # there already (tests/unit/roles/monitoring/test_alert_rules.py needs it)
        "promtool": "echo 'promtool, version 2.42.0'",
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    installs = [line.split() for line in log.read_text().splitlines() if line.startswith("install")]
    assert any("debian-archive-keyring" in words for words in installs), log.read_text()
    assert "debian-archive-keyring" in run.stdout
