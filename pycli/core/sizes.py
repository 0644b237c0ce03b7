"""Message sizes as nccl-tests writes them (4K, 64M, 1G): read from options, shown in reports."""

from __future__ import annotations

import re

from pycli.core.errors import BadInput

_SIZE = re.compile(r"^(?P<number>[0-9]+)(?P<unit>[KMG]?)B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str, what: str) -> int:
    """'4K', '256M', '1G' or a byte count, binary units as nccl-tests reads them; BadInput else."""
    match = _SIZE.match(text.strip())
    size = int(match["number"]) * _UNITS[match["unit"].upper()] if match else 0
    if size < 4 or size % 4:
        raise BadInput(f"{what} {text!r}: give a size such as 4K, 64M or 1G (a positive multiple of 4 bytes)")
    return size


def human_size(size: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"
