"""What `pycli check` can be asked, its defaults and their checks: the one home of each.

`pycli check`'s options (pycli/cli/check.py) take their defaults from `DEFAULTS`, and
`check_options` turns what the user typed into a `CheckOptions` before any node is touched;
the gates (pycli/health/gates.py) read only the `CheckOptions` they are given.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycli.core.errors import BadInput
from pycli.core.sizes import parse_size
from pycli.jobs.launch import HOROVOD_CONTROLLERS, check_controller
from pycli.jobs.request import DEFAULT_CONTROLLER

# --deep: the share of the others' median a node's compute and a pair's link must reach (the
# spread of healthy local nodes, measured in one sitting, is in docs/check.md).
DEFAULT_COMPUTE_FRACTION = 0.6
DEFAULT_LINK_FRACTION = 0.5
# --deep on GPU nodes with DCGM: `dcgmi diag -r 1` (about a minute; 0 does not run it).
DEFAULT_DCGM_LEVEL = 1


@dataclass(frozen=True)
class CheckOptions:
    busbw_floor_gbps: float = 0.0  # 0: no floor
    controller: str = DEFAULT_CONTROLLER  # horovodrun's controller for the allreduce gate
    allreduce_size: str = "64M"
    controllers: tuple[str, ...] = HOROVOD_CONTROLLERS  # --build-controllers: what every node's Horovod must have
    cuda_image: str = "nvidia/cuda:12.8.1-base-ubuntu22.04"
    # --deep (pycli/health/deep.py): which node or link is slow; --fence drains the suspects.
    deep: bool = False
    deep_only: bool = False  # only reachable and the deep gates: measure again after a repair
    fence: bool = False
    compute_fraction: float = DEFAULT_COMPUTE_FRACTION
    link_fraction: float = DEFAULT_LINK_FRACTION
    compute_seconds: float = 2.0
    link_seconds: int = 2
    dcgm_level: int = DEFAULT_DCGM_LEVEL  # pycli/health/gpu_health.py


DEFAULTS = CheckOptions()


def check_options(
    *, busbw_floor_gbps: float = DEFAULTS.busbw_floor_gbps, controller: str = DEFAULTS.controller,
    allreduce_size: str = DEFAULTS.allreduce_size, controllers: str = ",".join(DEFAULTS.controllers),
    cuda_image: str = DEFAULTS.cuda_image, deep: bool = False, deep_only: bool = False, fence: bool = False,
    compute_fraction: float = DEFAULTS.compute_fraction, link_fraction: float = DEFAULTS.link_fraction,
    dcgm_level: int = DEFAULTS.dcgm_level,
) -> CheckOptions:
    """The options, checked before any node is touched (BadInput, exit 2)."""
    if busbw_floor_gbps < 0:
        raise BadInput(f"--busbw-floor {busbw_floor_gbps}: a bandwidth floor is 0 (off) or more, in GB/s")
    check_controller(controller)
    parse_size(allreduce_size, "--allreduce-size")
    wanted = tuple(dict.fromkeys(part.strip().lower() for part in controllers.split(",") if part.strip()))
    unknown = [name for name in wanted if name not in HOROVOD_CONTROLLERS]
    if unknown or not wanted:
        raise BadInput(f"--build-controllers {controllers!r}: name one or more of {', '.join(HOROVOD_CONTROLLERS)}")
    if not cuda_image.strip() or any(ch.isspace() for ch in cuda_image.strip()):
        raise BadInput(f"--cuda-image {cuda_image!r} is not an image name")
    for option, value in (("--compute-fraction", compute_fraction), ("--link-fraction", link_fraction)):
        if not 0 < value < 1:
            raise BadInput(f"{option} {value:g}: give the share of the others' median a node must reach, between 0 and 1")
    if dcgm_level not in range(5):
        raise BadInput(f"--dcgm-level {dcgm_level}: dcgmi diag runs levels 1 (about a minute) to 4 (hours); 0 does not run it")
    deep = deep or deep_only
    if fence and not deep:
        raise BadInput("--fence drains the nodes the deep gates name; it needs --deep or --deep-only")
    return CheckOptions(busbw_floor_gbps, controller, allreduce_size, wanted, cuda_image.strip(), deep=deep,
                        deep_only=deep_only, fence=fence,
                        compute_fraction=compute_fraction, link_fraction=link_fraction, dcgm_level=dcgm_level)
