"""A human-readable summary of a dataset (what `vla-io info` prints)."""

from __future__ import annotations

from pathlib import Path

from .meta import DatasetMeta


def _shape(feature: dict) -> str:
    return "x".join(str(s) for s in feature.get("shape", []))


def describe(root: str | Path, max_tasks: int = 8) -> str:
    """Layout, sizes, features, tasks, statistics and modality slices of the dataset at `root`."""
    meta = DatasetMeta(root)
    lines = [
        f"dataset   {meta.root}  (metadata only: `vla-io check` decodes every frame)",
        f"layout    LeRobot {meta.version}",
        f"fps       {meta.fps:g}",
        f"episodes  {len(meta.episodes)}",
        f"frames    {meta.total_frames}  ({meta.total_frames / meta.fps / 60:.1f} min)",
        f"tasks     {len(meta.tasks)}",
    ]
    lines += [f"          [{i}] {t}" for i, t in list(meta.tasks.items())[:max_tasks]]
    if len(meta.tasks) > max_tasks:
        lines.append(f"          ... {len(meta.tasks) - max_tasks} more")
    lines.append("features")
    width = max(len(k) for k in meta.features)
    for key, feature in meta.features.items():
        extra = ""
        if feature.get("dtype") == "video":
            info = feature.get("info") or feature.get("video_info") or {}
            files = [ep.videos[key].path for ep in meta.episodes if key in ep.videos]
            present = sum(p.exists() for p in set(files))
            extra = f"  codec={info.get('video.codec', '?')}  files present={present}/{len(set(files))}"
            if not present:
                extra += "  (no files on disk: ignored unless asked for)"
        lines.append(f"  {key:<{width}}  {feature.get('dtype', '?'):<8} {_shape(feature):<10}{extra}")
    lines.append(f"stats     {', '.join(sorted(meta.stats)) if meta.stats else 'none'}")
    if meta.modality is not None:
        lines.append("modality")
        for group in meta.modality.groups():
            parts = [
                f"{e.name}" + (f"[{e.start}:{e.end}]" if e.start is not None else f"<-{e.key}")
                for e in meta.modality.slices(group).values()
            ]
            lines.append(f"  {group:<10} {', '.join(parts)}")
    return "\n".join(lines)
