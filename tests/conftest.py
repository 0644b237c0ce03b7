import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYCLI = [sys.executable, "-m", "pycli"]
# Every test cluster trusts this machine's CA bundle (pip behind a TLS-intercepting proxy),
# and all share one node image.
TEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def run_pycli(*args: str, check: bool = False, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would, and capture what it prints."""
    proc = subprocess.run(
        [*PYCLI, *args], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pycli {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session", autouse=True)
def _isolated_runs(tmp_path_factory):
    # Run folders of the tests go to a temporary place, not the checkout's runs/.
    os.environ.setdefault("PYCLI_RUNS", str(tmp_path_factory.mktemp("runs")))
