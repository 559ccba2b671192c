"""The content of synthetic datasets: deterministic frames that carry their own index, and parquet rows
whose first columns identify them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .marker import draw_marker, frame_marker

if TYPE_CHECKING:
    from .synth import SynthConfig


class ContentGenerator:
    """Deterministic frames and rows of a synthetic dataset."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        # a smooth random texture per camera, rolled over time: motion a codec can predict, like a scene
        sizes = cfg.sizes()
        blocks = (-(-max(h for h, _ in sizes) // 8), -(-max(w for _, w in sizes) // 8))
        noise = rng.integers(0, 256, size=(len(cfg.cameras), *blocks), dtype=np.uint8)
        texture = np.repeat(np.repeat(noise, 8, axis=1), 8, axis=2)
        self._texture = [texture[c, :h, :w] for c, (h, w) in enumerate(sizes)]
        self._grid = [np.mgrid[0:h, 0:w].astype(np.float32) for h, w in sizes]
        self._phases = rng.uniform(0, 2 * np.pi, size=(max(cfg.state_dim, cfg.action_dim),))

    def rows(self, episode: int, start_index: int, length: int) -> dict[str, np.ndarray]:
        """The parquet columns of one episode."""
        f = np.arange(length)
        return self.rows_of(np.full(length, episode), f, start_index + f)

    def rows_of(self, episode: np.ndarray, frame: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
        """The parquet columns of any rows at once, given each row's episode, frame and global index (the
        same values `rows` gives, row for row: a whole dataset's rows in one vectorized call)."""
        cfg = self.cfg
        t = frame.astype(np.float64) / cfg.fps
        ep = episode.astype(np.float64)[:, None]

        def curves(dim: int, speed: float) -> np.ndarray:
            x = np.sin(speed * t[:, None] + self._phases[None, :dim] + ep).astype(np.float32)
            x[:, 0], x[:, 1], x[:, 2] = index, episode, frame  # identifiers, exact in float32 below 2**24
            return x

        return {
            "observation.state": curves(cfg.state_dim, 1.3),
            "action": curves(cfg.action_dim, 2.1),
            "timestamp": t.astype(np.float32),
            "frame_index": frame.astype(np.int64),
            "episode_index": episode.astype(np.int64),
            "index": index.astype(np.int64),
            "task_index": (episode % len(cfg.tasks)).astype(np.int64),
        }

    def frame(self, camera: int, episode: int, frame_index: int, global_index: int) -> np.ndarray:
        """One (H, W, 3) uint8 frame."""
        p = 0.15 * frame_index + episode + camera
        yy, xx = self._grid[camera]
        img = np.empty((*yy.shape, 3), dtype=np.uint8)
        img[..., 0] = (128 + 90 * np.sin(xx * 0.04 + p)).astype(np.uint8)
        img[..., 1] = (128 + 90 * np.sin(yy * 0.05 - 0.7 * p)).astype(np.uint8)
        img[..., 2] = np.roll(self._texture[camera], shift=2 * frame_index, axis=1)
        draw_marker(img, frame_marker(global_index, camera))
        return img
