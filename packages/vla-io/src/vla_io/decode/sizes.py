"""The frame size of each camera: what `meta/info.json` declares, checked against the videos themselves.

A batch stacks the frames of a camera, so they must all have one size. The declared shape is that size
while at least one video has it; a video at another size is then a bad file (its samples fail with a
`VideoDecodeError` naming file, episode, key and frames, and `skip_bad_samples` skips them). A camera none
of whose videos has the declared shape (re-encoded without updating info.json) is read at the size its
videos really have, with a warning naming both: the frames agree with each other, and resizing is the
caller's image step's job, so only the metadata is wrong (`vla-io check` reports it).
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

Size = tuple[int, int]
"""(height, width)."""
PROBES = 3
"""Videos per camera whose size is read when a dataset opens (first, middle and last episode)."""


def size_text(size: Size) -> str:
    """'96x128': height x width, as `vla-io synth --cameras` writes sizes."""
    return f"{size[0]}x{size[1]}"


def declared_size(feature: Mapping[str, Any]) -> Size | None:
    """(height, width) of a video feature of info.json: from `shape` and its `names`, else the `info`
    block's video.height / video.width, else a 3-d shape read as (H, W, C) or (C, H, W) by where the
    channels sit. None when nothing says."""
    shape = [int(s) for s in feature.get("shape") or [] if isinstance(s, (int, float))]
    names = feature.get("names")
    names = [str(n).lower() for n in names] if isinstance(names, list) else []
    if len(shape) == len(names) and "height" in names and "width" in names:
        return shape[names.index("height")], shape[names.index("width")]
    info = feature.get("info") or feature.get("video_info") or {}
    if isinstance(info, Mapping) and "video.height" in info and "video.width" in info:
        return int(info["video.height"]), int(info["video.width"])
    if len(shape) == 3 and shape[-1] in (1, 3, 4):
        return shape[0], shape[1]
    if len(shape) == 3 and shape[0] in (1, 3, 4):
        return shape[1], shape[2]
    return None


def reference_size(declared: Size | None, found: Sequence[Size]) -> Size | None:
    """The size every frame of a camera must have: the declared one if any video has it (or none was
    looked at), else the most common size among the videos (the first seen on a tie)."""
    if declared is not None and (declared in found or not found):
        return declared
    return Counter(found).most_common(1)[0][0] if found else None


def probe_size(path: str, backend: str) -> Size | None:
    """(height, width) of the frames `backend` decodes from `path`, from the container's headers (no
    frame decoded; torchcodec's is after rotation, as it decodes). None when it cannot be read, or is not a
    regular file (a FIFO would block the process opening the dataset, outside any worker's timeout):
    decoding reports that file itself."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        if backend == "torchcodec":
            from torchcodec.decoders import VideoDecoder

            meta = VideoDecoder(path, seek_mode="approximate", device="cpu").metadata
            size = int(meta.height or 0), int(meta.width or 0)
        else:
            import av

            with av.open(path) as container:
                codec = container.streams.video[0].codec_context
                size = int(codec.height), int(codec.width)
    except Exception:
        return None
    return size if min(size) > 0 else None  # a header without dimensions says nothing


def camera_sizes(meta: Any, episodes: Sequence[Any], keys: Sequence[str], backend: str) -> dict[str, Size]:
    """{camera: the size its frames must have} from a few of its videos (`PROBES`), warning once per camera
    whose videos are not at the declared size."""
    sizes = {}
    for key in keys:
        files = list(dict.fromkeys(str(ep.videos[key].path) for ep in episodes if key in ep.videos))
        picks = list(dict.fromkeys(files[i] for i in (0, len(files) // 2, len(files) - 1))) if files else []
        found = [size for size in (probe_size(path, backend) for path in picks[:PROBES]) if size]
        declared = declared_size(meta.features.get(key, {}))
        size = reference_size(declared, found)
        if size is None:
            continue
        if declared is not None and size != declared:
            log.warning(
                "%s: camera %r: its videos are %s (height x width) but meta/info.json declares %s; its frames "
                "are used at their real size (an image transform such as ImageAugment resizes any size). "
                "`vla-io check` reports it",
                meta.root, key, size_text(size), size_text(declared),
            )  # fmt: skip
        sizes[key] = size
    return sizes
