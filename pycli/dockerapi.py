"""The Docker engine, reached through its own API (the docker SDK)."""

from __future__ import annotations

import docker
from docker.errors import DockerException

from pycli.errors import BadInput


def connect() -> docker.DockerClient:
    """A client for the engine that answers, or a one-line error saying how to get one."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(
            f"cannot reach the Docker engine ({reason}); "
            "run 'sudo scripts/host-prereqs.sh' to install and start it"
        ) from None
    return client
