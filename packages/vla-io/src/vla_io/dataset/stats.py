"""Feature statistics in LeRobot's stats.json shape: {feature: {mean, std, min, max, q01, q99, count}}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Stats = dict[str, dict[str, np.ndarray]]


def feature_stats(values: np.ndarray, quantiles: bool = True) -> dict[str, np.ndarray]:
    """Statistics over axis 0 of an (N, ...) array; images (N, C, H, W) reduce to per-channel (C, 1, 1)."""
    x = np.asarray(values, dtype=np.float64)
    axes: tuple[int, ...] = (0, 2, 3) if x.ndim == 4 else (0,)
    keep = x.ndim == 4
    out = {
        "mean": x.mean(axis=axes, keepdims=keep),
        "std": x.std(axis=axes, keepdims=keep),
        "min": x.min(axis=axes, keepdims=keep),
        "max": x.max(axis=axes, keepdims=keep),
        "count": np.array([x.shape[0]]),
    }
    if keep:  # drop the leading sample axis kept by keepdims: (1, C, 1, 1) -> (C, 1, 1)
        out = {k: (v[0] if k != "count" else v) for k, v in out.items()}
    if quantiles and not keep:
        out["q01"] = np.quantile(x, 0.01, axis=0)
        out["q99"] = np.quantile(x, 0.99, axis=0)
    return out


def aggregate_stats(per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> Stats:
    """Combine per-episode statistics (v2.1's episodes_stats.jsonl) into dataset statistics.

    Means and variances are combined exactly, weighted by each episode's count; min/max are global.
    Quantiles cannot be combined exactly and are left out.
    """
    keys = sorted(set().union(*(s.keys() for s in per_episode))) if per_episode else []
    result: Stats = {}
    for key in keys:
        parts = [s[key] for s in per_episode if key in s]
        counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
        total = counts.sum()
        if total <= 0:
            continue
        w = [c / total for c in counts]
        means = [np.asarray(p["mean"], dtype=np.float64) for p in parts]
        mean = sum(wi * m for wi, m in zip(w, means))
        # E[x^2] per episode is std^2 + mean^2; the global variance follows from the weighted sum
        second = sum(wi * (np.asarray(p["std"], np.float64) ** 2 + m**2) for wi, p, m in zip(w, parts, means))
        result[key] = {
            "mean": mean,
            "std": np.sqrt(np.maximum(second - mean**2, 0.0)),
            "min": np.min([np.asarray(p["min"]) for p in parts], axis=0),
            "max": np.max([np.asarray(p["max"]) for p in parts], axis=0),
            "count": np.array([int(total)]),
        }
    return result


def stats_to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Plain lists, ready for json.dump."""
    return {k: {s: np.asarray(v).tolist() for s, v in d.items()} for k, d in stats.items()}


def stats_from_json(data: Mapping[str, Mapping[str, object]]) -> Stats:
    """numpy arrays from the lists of a stats.json file."""
    return {k: {s: np.asarray(v) for s, v in d.items()} for k, d in data.items() if isinstance(d, Mapping)}
