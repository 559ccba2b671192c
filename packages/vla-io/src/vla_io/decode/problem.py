"""One problem `vla-io check` found: where (file, episode, key, episode frames) and what."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem: where (file, episode, key, episode frames) and what."""

    file: str
    episode: int | None
    key: str | None
    frames: str
    reason: str

    def line(self) -> str:
        """One line for the report."""
        where = [self.file]
        if self.episode is not None:
            where.append(f"episode {self.episode}")
        if self.key:
            where.append(f"key {self.key!r}")
        if self.frames:
            where.append(f"frames {self.frames}")
        return ", ".join(where) + f": {self.reason}"
