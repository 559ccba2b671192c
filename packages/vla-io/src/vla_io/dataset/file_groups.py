"""Which video files each episode reads: the key for routing samples to workers.

In LeRobot v2.x every episode has its own files, so the episode is the natural key. In v3.0 hundreds of
episodes share one file per camera; routing by episode would send every file's episodes to every worker,
and once a worker touches more files than its reader cache holds, it closes and reopens files for nearly
every sample (`benchmarks/io_scale.py --max-open-videos` below the file count shows it). Keyed by their
files, each worker reads only the files of its own episodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .meta import Episode


def file_group_keys(episodes: Sequence[Episode], video_keys: Sequence[str]) -> np.ndarray:
    """An int64 key per episode, equal for episodes that read the same video file of every camera in
    `video_keys` (one key per episode where each has its own files). With no cameras, the episode."""
    if not video_keys:
        return np.arange(len(episodes), dtype=np.int64)
    names = ["\0".join(str(ep.videos[k].path) for k in video_keys) for ep in episodes]
    return np.unique(np.asarray(names), return_inverse=True)[1].reshape(-1).astype(np.int64)
