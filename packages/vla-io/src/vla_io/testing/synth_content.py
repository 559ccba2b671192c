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
        cfg = self.cfg
        f = np.arange(length)
        g = start_index + f
        t = f.astype(np.float64) / cfg.fps

        def curves(dim: int, speed: float) -> np.ndarray:
            x = np.sin(speed * t[:, None] + self._phases[None, :dim] + episode).astype(np.float32)
            x[:, 0], x[:, 1], x[:, 2] = g, episode, f  # identifiers, exact in float32 below 2**24
            return x

        return {
            "observation.state": curves(cfg.state_dim, 1.3),
            "action": curves(cfg.action_dim, 2.1),
            "timestamp": t.astype(np.float32),
            "frame_index": f.astype(np.int64),
            "episode_index": np.full(length, episode, dtype=np.int64),
            "index": g.astype(np.int64),
            "task_index": np.full(length, episode % len(cfg.tasks), dtype=np.int64),
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
