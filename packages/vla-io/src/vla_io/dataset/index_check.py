"""Episodes that have data on disk but no entry in the episodes index: they would be ignored in silence."""

from __future__ import annotations

import re
import string
from pathlib import Path

import numpy as np

from .meta import DatasetMeta
from .parquet_file import read_parquet


def unindexed_episodes(meta: DatasetMeta) -> list[tuple[Path, int]]:
    """(data file, episode_index) of every episode found in the data files but not in the index."""
    known = {e.index for e in meta.episodes}
    if meta.is_v3:
        found = []
        for path in sorted((meta.root / "data").glob("**/*.parquet")):
            try:
                column = read_parquet(path, ["episode_index"]).column(0).to_numpy()
            except Exception:  # unreadable or no such column: the frame table reports it when used
                continue
            found += [(path, int(e)) for e in np.unique(column) if int(e) not in known]
        return found
    pattern = _path_pattern(str(meta.info["data_path"]))
    found = []
    for path in sorted(meta.root.glob("data/**/*.parquet")):
        match = pattern.fullmatch(path.relative_to(meta.root).as_posix())
        if match and int(match.group("episode_index")) not in known:
            found.append((path, int(match.group("episode_index"))))
    return found


def _path_pattern(template: str) -> re.Pattern[str]:
    """'data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet' as a regex with named groups."""
    parts, seen = [], set()
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name:
            parts.append(f"(?P<{name}>\\d+)" if name not in seen else "\\d+")
            seen.add(name)
    return re.compile("".join(parts))
