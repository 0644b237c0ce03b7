"""The Docker engine, reached through its own API (the docker SDK)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

import docker
from docker.errors import DockerException

from pycli.core.errors import BadInput, PycliError
from pycli.core.tree import host_prereqs_command


def connect() -> docker.DockerClient:
    """A client for the engine that answers, or a one-line error saying how to get one."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(
            f"cannot reach the Docker engine ({reason}); "
            f"run '{host_prereqs_command()}' to install and start it"
        ) from None
    return client


# How long one command in a node container may take before pycli gives up on it.
EXEC_TIMEOUT_S = 120


def run_in(container: str, argv: Sequence[str], timeout_s: float = EXEC_TIMEOUT_S) -> tuple[int, str]:
    """Run argv in a running container: its exit code and its output (stdout and stderr together).

    Through the engine's own command line (`docker exec`), not the SDK's exec_run: the SDK reads
    the output from the socket after http.client has parsed the response's head, and output that
    came in the same read as the head is lost (docker-py issue 2042, open). It happens when the
    reader is slow: on a loaded 2-core machine a niced exec_run of `echo hi` came back empty, with
    exit code 0, 26 times in 60; `docker exec` 0 in 60.
    """
    try:
        done = subprocess.run(
            ["docker", "exec", container, *argv],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False,
        )
    except FileNotFoundError:
        raise BadInput(f"the docker command is not installed; run '{host_prereqs_command()}'") from None
    except subprocess.TimeoutExpired:
        raise PycliError(f"{shlex.join(argv)} in {container} did not end within {timeout_s:.0f} s") from None
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")
