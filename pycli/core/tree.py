"""The tree pycli drives (roles, playbooks, workloads, ansible.cfg, the host's set-up script) and
where it is: in an installed wheel, the copy the build put in the package (pycli/_project,
setup.py); in a checkout installed editable, the checkout itself, read in place. Standard library
only: scripts/host-prereqs.sh runs the machine's python3 on pycli.local.host_limits, which names
the script through HOST_PREREQS. pycli.core.paths holds the rest of where pycli keeps things.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
from pathlib import Path
from types import ModuleType


def _project_root() -> Path:
    bundled = Path(str(importlib.resources.files("pycli") / "_project"))
    if (bundled / "playbooks").is_dir():
        return bundled
    return Path(__file__).resolve().parents[2]  # this file is pycli/core/tree.py


PROJECT_ROOT = _project_root()
# Where Ansible finds the roles' own modules and filters by their full names (pycli.cluster.NAME):
# a collection path whose pycli/cluster holds plugins/ (ansible.cfg's collections_path names it).
COLLECTIONS = PROJECT_ROOT / "collections"
# What makes this machine able to run a local cluster (Docker, debootstrap, the kernel's limits), run as root.
HOST_PREREQS = PROJECT_ROOT / "scripts" / "host-prereqs.sh"


@functools.cache
def plugin(kind: str, name: str) -> ModuleType:
    """One of the roles' plugins (plugins/KIND/NAME.py; pycli.cluster.NAME to Ansible) as a module,
    for a rule pycli applies before a run exactly as the roles apply it during one."""
    path = PROJECT_ROOT / "plugins" / kind / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"pycli_cluster_{kind}_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no plugin {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_prereqs_command() -> str:
    """The command line that runs HOST_PREREQS, as pycli's messages name it."""
    return f"sudo bash {HOST_PREREQS}"
