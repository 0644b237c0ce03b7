"""The node image of a local cluster: Debian with systemd, sshd, python3 and sudo.

No registry can be assumed, so the image is made from Debian's own packages: debootstrap
into the cache, a little configuration for life in a container, then `docker import`.
The tag is a hash of everything that goes in, so a second build with the same inputs
finds the image and does nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pycli.core.errors import BadInput, PycliError
from pycli.core.paths import NODE_PACKAGE, cache_dir

if TYPE_CHECKING:
    import docker

IMAGE_REPOSITORY = "pycli-node"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What a node needs before Ansible takes over: an init, sshd, a Python for Ansible
# (python3-apt saves the apt module installing it on every first run), sudo.
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "python3", "python3-apt",
    "ca-certificates", "iproute2", "iputils-ping", "procps", "less",
)
# Bump when the configuration below changes, so old images are not taken for new ones.
RECIPE_VERSION = 2
SUPPORTED_SUITES = ("bookworm",)
EXTRA_CA_NAME = "pycli-extra-ca.crt"
LABEL_KEY = "io.pycli.image-key"
# The runtime a node's own Docker engine uses to start containers inside the node
# container (see the file's header); local clusters only, real hosts never need it.
NESTED_RUNTIME = NODE_PACKAGE / "runc-nested"
NESTED_RUNTIME_PATH = "usr/local/bin/runc-nested"
# Debian's archive keys (package debian-archive-keyring). debootstrap is always pointed at it:
# without --keyring, a controller that lacks it (Ubuntu's debootstrap does not pull it in)
# only warns and installs whatever the mirror, or anything between, serves.
DEBIAN_ARCHIVE_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


@dataclass(frozen=True)
class ImageSpec:
    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    ca_bundle: Path | None = None

    def validate(self) -> None:
        if self.suite not in SUPPORTED_SUITES:
            raise BadInput(f"suite {self.suite!r} is not supported; use one of: {', '.join(SUPPORTED_SUITES)}")
        if not self.mirror.startswith(("http://", "https://")):
            raise BadInput(f"mirror {self.mirror!r} is not an http(s) URL")
        if self.ca_bundle is not None:
            _read_ca_bundle(self.ca_bundle)

    def key(self) -> str:
        recipe = {
            "suite": self.suite,
            "mirror": self.mirror,
            "packages": PACKAGES,
            "recipe": RECIPE_VERSION,
            "nested_runtime": hashlib.sha256(NESTED_RUNTIME.read_bytes()).hexdigest(),
            "ca": hashlib.sha256(_read_ca_bundle(self.ca_bundle)).hexdigest() if self.ca_bundle else None,
        }
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.suite}-{self.key()}"

    @property
    def security_mirror(self) -> str:
        # Debian publishes security updates beside the main archive (…/debian-security).
        return self.mirror.rstrip("/") + "-security"


def _read_ca_bundle(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read CA bundle {path}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise BadInput(f"CA bundle {path} holds no PEM certificate")
    return data


def image_exists(client: docker.DockerClient, spec: ImageSpec) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(spec.tag)
    except ImageNotFound:
        return False
    return True


def ensure_image(client: docker.DockerClient, spec: ImageSpec, *, say: Callable[[str], None] = print) -> str:
    """Return the image tag for `spec`, building the image first when it is not there."""
    spec.validate()
    if image_exists(client, spec):
        say(f"node image {spec.tag} is already built")
        return spec.tag
    _check_can_build()
    locks = cache_dir() / "images"
    locks.mkdir(parents=True, exist_ok=True)
    # Builds share debootstrap's package cache: one builds at a time, the others wait.
    with open(locks / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(client, spec):
            say(f"node image {spec.tag} was built meanwhile")
            return spec.tag
        return _build(client, spec, say)


def _build(client: docker.DockerClient, spec: ImageSpec, say: Callable[[str], None]) -> str:
    started = time.monotonic()
    work = cache_dir() / "images" / f"build-{spec.key()}"
    rootfs = work / "rootfs"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        say(f"building node image {spec.tag}: debootstrap {spec.suite} from {spec.mirror} (about a minute)")
        _debootstrap(spec, rootfs, work / "debootstrap.log")
        _configure_rootfs(spec, rootfs)
        tarball = work / "rootfs.tar"
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], "packing the root filesystem")
        client.api.import_image_from_file(
            str(tarball),
            repository=IMAGE_REPOSITORY,
            tag=f"{spec.suite}-{spec.key()}",
            changes=['CMD ["/sbin/init"]', "ENV container=docker", f"LABEL {LABEL_KEY}={spec.key()}"],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"built node image {spec.tag} in {time.monotonic() - started:.0f} s")
    return spec.tag


def _check_can_build() -> None:
    if os.geteuid() != 0:
        raise BadInput("building the node image runs debootstrap, which needs root: run this as root (sudo)")
    if shutil.which("debootstrap") is None:
        raise BadInput("debootstrap is missing: run 'sudo scripts/host-prereqs.sh'")
    if not DEBIAN_ARCHIVE_KEYRING.is_file():
        raise BadInput(
            f"{DEBIAN_ARCHIVE_KEYRING} is missing, so debootstrap cannot check Debian's signatures: "
            "install debian-archive-keyring (sudo apt-get install debian-archive-keyring, or run 'sudo scripts/host-prereqs.sh')"
        )


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    with open(log, "wb") if log else open(os.devnull, "wb") as sink:
        proc = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT if log else subprocess.PIPE)
    if proc.returncode != 0:
        detail = ""
        if log and log.exists():
            tail = log.read_text(errors="replace").strip().splitlines()[-1:]
            detail = f": {tail[0]}" if tail else ""
        elif proc.stderr:
            detail = ": " + proc.stderr.decode(errors="replace").strip().splitlines()[-1]
        raise PycliError(f"{what} failed (exit {proc.returncode}){detail}")


def debootstrap_argv(spec: ImageSpec, rootfs: Path, packages_cache: Path) -> list[str]:
    """debootstrap's command line: the Release file's signature is always checked against Debian's keyring."""
    return [
        "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        f"--keyring={DEBIAN_ARCHIVE_KEYRING}", f"--cache-dir={packages_cache}",
        spec.suite, str(rootfs), spec.mirror,
    ]


def _debootstrap(spec: ImageSpec, rootfs: Path, log: Path) -> None:
    packages_cache = cache_dir() / "debootstrap" / spec.suite
    packages_cache.mkdir(parents=True, exist_ok=True)
    _run(
        debootstrap_argv(spec, rootfs, packages_cache.resolve()),
        f"debootstrap of {spec.suite} (log kept only while building)",
        log,
    )


def _write(rootfs: Path, relative: str, text: str, mode: int = 0o644) -> None:
    target = rootfs / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def _configure_rootfs(spec: ImageSpec, rootfs: Path) -> None:
    """Make the tree fit to boot as many distinct nodes from one image."""
    _write(
        rootfs, "etc/apt/sources.list.d/debian.sources",
        f"Types: deb\nURIs: {spec.mirror}\nSuites: {spec.suite} {spec.suite}-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        f"Types: deb\nURIs: {spec.security_mirror}\nSuites: {spec.suite}-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    # Each node must get its own host keys and machine id, made on its first boot.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    _write(
        rootfs, "etc/systemd/system/ssh.service.d/pycli-host-keys.conf",
        "# Generated by pycli: host keys are made on each node's first boot, not baked into the image.\n"
        "[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n",
    )
    _write(rootfs, NESTED_RUNTIME_PATH, NESTED_RUNTIME.read_text(), 0o755)
    _write(rootfs, "etc/machine-id", "")
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (rootfs / "etc/hostname").unlink(missing_ok=True)
    if spec.ca_bundle is not None:
        _write(rootfs, f"usr/local/share/ca-certificates/{EXTRA_CA_NAME}", _read_ca_bundle(spec.ca_bundle).decode())
        _run(["chroot", str(rootfs), "update-ca-certificates"], "adding the extra CA bundle")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / leftover).glob("*"):
            if item.is_file():
                item.unlink()
