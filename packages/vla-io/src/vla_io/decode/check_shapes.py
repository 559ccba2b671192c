"""What `vla-io check` concludes across files rather than inside one: features that meta/info.json declares
but data files lack, and video frames at another size than the rest of their camera's (`decode.sizes`
holds the rule `LeRobotDataset` reads by). Each finding is (file, episode, key, frames, reason)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..dataset.table import index_ranges
from .sizes import Size, declared_size, reference_size, size_text

Finding = tuple[str, "int | None", "str | None", str, str]
INFO = "meta/info.json"


def column_findings(meta: Any, files: Sequence[tuple[str, list[int], Iterable[str]]]) -> list[Finding]:
    """`files`: (data file, its episodes, its columns) of every data file read. A declared feature that no
    file holds is one finding on meta/info.json; one that some files lack, a finding per such file."""
    declared = [k for k, f in meta.features.items() if f.get("dtype") not in ("video", "image")]
    held = [(path, episodes, set(columns)) for path, episodes, columns in files]
    found: list[Finding] = []
    for key in declared:
        lacking = [(path, episodes) for path, episodes, columns in held if key not in columns]
        if not lacking:
            continue
        if len(lacking) == len(held):
            feature = meta.features[key]
            kind = f"{feature.get('dtype', '?')}{list(feature.get('shape') or [])}"
            reason = f"declares feature {key!r} ({kind}), but no data file has that column"
            found.append((str(meta.root / INFO), None, key, "", reason))
            continue
        for path, episodes in lacking:
            which = f" (episodes {index_ranges(sorted(episodes))})" if len(episodes) > 1 else ""
            found.append((
                path, episodes[0] if len(episodes) == 1 else None, key, "all",
                f"no such column{which}, though meta/info.json declares the feature and other data files have it",
            ))  # fmt: skip
    return found


def size_findings(meta: Any, videos: Sequence[tuple[str, int, str, dict[Size, list[int]]]]) -> list[Finding]:
    """`videos`: (video file, episode, camera, {frame size: the episode's frames decoded at it}) of every
    video checked. Frames at another size than their camera's are findings on their file; a camera none of
    whose videos has the declared size, one on meta/info.json."""
    by_key: dict[str, list[tuple[str, int, dict[Size, list[int]]]]] = {}
    for path, episode, key, sizes in videos:
        by_key.setdefault(key, []).append((path, episode, sizes))
    found: list[Finding] = []
    for key, checked in by_key.items():
        declared = declared_size(meta.features.get(key, {}))
        usual = [max(sizes, key=lambda s: len(sizes[s])) for _, _, sizes in checked if sizes]
        reference = reference_size(declared, usual)
        if reference is None:
            continue
        for path, episode, sizes in checked:
            for size, frames in sizes.items():
                if size != reference:
                    found.append((
                        path, episode, key, index_ranges(sorted(frames)),
                        f"{len(frames)} frame(s) are {size_text(size)} (height x width) where this camera's are "
                        f"{size_text(reference)}: reading them fails (skip_bad_samples skips them)",
                    ))  # fmt: skip
        if declared is not None and reference != declared:
            found.append((
                str(meta.root / INFO), None, key, "",
                f"declares {size_text(declared)} (height x width), but no video of this camera has that size; "
                f"they are {size_text(reference)}: LeRobotDataset reads them at that size, with a warning. "
                "Correct the declared shape",
            ))  # fmt: skip
    return found
