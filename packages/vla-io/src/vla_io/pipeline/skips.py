"""Skipping samples that cannot be decoded (`PipelineConfig.skip_bad_samples`).

A batch whose decoding fails is loaded again sample by sample; each sample that fails is replaced by another
one, chosen by a hash of its index (deterministic, so a resumed run sees the same substitutes) and loaded
the same way. A sample whose tensors have another shape than most of its batch (a camera's frame at another
size, from a dataset that does not check sizes itself) would make the batch impossible to stack: it is
replaced the same way, by a substitute of the batch's shape. The batch carries one note per row under
`SKIP_KEY` (None, or what was skipped and why); the pipeline takes the notes out before the caller's
transform, counts the skipped samples when their batch is delivered (so the count is exact at every
`state_dict()`), and warns once per episode.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._errors import SAMPLE_ERRORS, DatasetFormatError
from .._seeds import mix64

log = logging.getLogger(__name__)
SKIP_KEY = "skipped_samples"
SUBSTITUTES = 16
"""Other samples tried in turn for one that cannot be decoded, before the batch fails."""


def substitute(index: int, attempt: int, num_samples: int) -> int:
    """The `attempt`-th replacement for sample `index`: spread over the dataset, so it is unlikely to sit in
    the same (possibly broken) file."""
    key = np.array([(index << 8) + attempt], dtype=np.uint64)
    return int(mix64(key)[0] % np.uint64(num_samples))


def load_skipping(
    dataset: Any, indices: np.ndarray, load_rows: Callable[[np.ndarray], dict[str, Any]]
) -> dict[str, Any]:
    """The batch of `indices`, loaded one sample at a time, undecodable samples and samples of another shape
    than most of the batch replaced (notes under SKIP_KEY). Raises the first sample's error if none of its
    substitutes loads (and fits) either."""
    order = [int(i) for i in indices]
    loaded = [_load_one(dataset, index, load_rows) for index in order]
    shapes = [_shapes(row) for row, _ in loaded]
    common = Counter(shapes).most_common(1)[0][0]
    for i, (index, shape) in enumerate(zip(order, shapes)):
        if shape != common:
            misfit = DatasetFormatError(_difference(shape, common))
            loaded[i] = _load_one(dataset, index, load_rows, fits=common, failed=misfit)
    batch = _concat([row for row, _ in loaded])
    batch[SKIP_KEY] = [note for _, note in loaded]
    return batch


def _load_one(
    dataset: Any, index: int, load_rows: Callable[[np.ndarray], dict[str, Any]],
    fits: Shapes | None = None, failed: BaseException | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:  # fmt: skip
    """Sample `index` and its note (None), or, when it fails to load (or `failed` says why it cannot be
    used), the first substitute that loads and has the shapes `fits`, and a note naming both."""
    note = describe(dataset, index, failed) if failed is not None else None
    first = failed
    for attempt in range(1 if failed is not None else 0, SUBSTITUTES + 1):
        source = index if attempt == 0 else substitute(index, attempt, len(dataset))
        try:
            row = load_rows(np.array([source]))
        except SAMPLE_ERRORS as err:
            if attempt == 0:
                note, first = describe(dataset, index, err), err
            continue
        if fits is not None and _shapes(row) != fits:
            continue
        if note is not None:
            note["substitute"] = source
        return row, note
    assert first is not None
    raise type(first)(f"{first} (and {SUBSTITUTES} substitute samples failed too)") from first


Shapes = tuple[tuple[str, tuple[int, ...]], ...]


def _shapes(row: dict[str, Any]) -> Shapes:
    """(key, shape past the batch axis) of every tensor of a loaded row: what must agree to stack rows."""
    return tuple((k, tuple(v.shape[1:])) for k, v in row.items() if isinstance(v, torch.Tensor))


def _difference(shape: Shapes, common: Shapes) -> str:
    theirs = dict(common)
    for key, mine in shape:
        if theirs.get(key) != mine:
            return f"key {key!r} has shape {mine} where the batch's other samples have {theirs.get(key)}"
    return f"keys {[k for k, _ in shape]} differ from the batch's other samples' {[k for k, _ in common]}"


def describe(dataset: Any, index: int, err: BaseException) -> dict[str, Any]:
    """What a skip note records: the sample, its episode and frame when the dataset can say, the error."""
    locate = getattr(dataset, "sample_location", None)
    episode, frame = locate(index) if locate is not None else (None, None)
    return {"index": index, "episode": episode, "frame": frame, "error": f"{type(err).__name__}: {err}"}


def _concat(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in rows[0].items():
        values = [row[key] for row in rows]
        out[key] = (
            torch.cat(values) if isinstance(first, torch.Tensor) else [v for part in values for v in part]
        )
    return out


class SkipLog:
    """The pipeline's side: notes held per batch until it is delivered, then counted and warned about."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self._warned: set[Any] = set()
        self.count = 0
        """Samples skipped in batches delivered so far (restored by `Pipeline.load_state_dict`)."""

    def take(self, batch: dict[str, Any], tag: tuple[int, int]) -> None:
        """Remove the notes from a loaded batch and hold them until `deliver(tag)`."""
        notes = [n for n in batch.pop(SKIP_KEY, None) or [] if n is not None]
        if notes:
            with self._lock:
                self._held[tag] = notes

    def deliver(self, tag: tuple[int, int]) -> None:
        """Batch `tag` reached the consumer: count its skipped samples, warn once per episode."""
        with self._lock:
            notes = self._held.pop(tag, [])
        for note in notes:
            self.count += 1
            where = note["episode"] if note["episode"] is not None else note["error"]
            if where in self._warned:
                continue
            self._warned.add(where)
            log.warning(
                "skipped sample %d (episode %s, frame %s), which cannot be decoded as the dataset says; sample %s "
                "is used in its place. %s. Later bad samples of this episode are skipped silently (counted in "
                "the summary)",
                note["index"],
                note["episode"],
                note["frame"],
                note.get("substitute"),
                note["error"],
            )

    def forget_pending(self) -> None:
        """The stream was repositioned: held notes belong to batches that will be loaded again."""
        with self._lock:
            self._held.clear()
