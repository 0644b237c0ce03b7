"""The metrics file of a training run: a JSON record per epoch, written by rank 0."""

from __future__ import annotations

import json
import os
from pathlib import Path


class Metrics:
    """Rank 0 prints a line and appends a JSON record per epoch; other ranks stay quiet."""

    def __init__(self, path: Path | None, rank: int) -> None:
        self.path, self.rank = path, rank
        if path and rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)

    def read(self, until_epoch: int) -> list[dict]:
        """The records of epochs up to `until_epoch` in this node's file (none where there is none)."""
        if not self.path or not self.path.is_file():
            return []
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # half a line, written as the rank was killed
                continue
            if isinstance(record, dict) and record.get("epoch", 0) <= until_epoch:
                kept.append(record)
        return kept

    def keep_until(self, epoch: int) -> None:
        """Drop records of epochs after `epoch`: a restart from that checkpoint does them again."""
        if self.rank != 0 or not self.path or not self.path.is_file():
            return
        kept = self.read(epoch)
        if len(kept) != len(self.path.read_text().splitlines()):
            self.write_all(kept)

    def write_all(self, records: list[dict]) -> None:
        """The file holds exactly `records`, replaced in one step (the same on every node that writes it)."""
        if not self.path:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(record) + "\n" for record in records))
        os.replace(tmp, self.path)

    @staticmethod
    def show(record: dict) -> None:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()), flush=True)

    def log(self, record: dict) -> None:
        if self.rank != 0:
            return
        self.show(record)
        if self.path:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
