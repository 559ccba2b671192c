"""Synthetic LeRobot datasets with real encoded mp4 files whose frames carry their own index.

The content is made for tests and benchmarks (`synth_content`): frame `g` of camera `c` shows a moving
pattern and a marker holding `g * 16 + c` (see `marker.read_frame_marker`); `observation.state[:, :3]` and
`action[:, :3]` hold the global index, the episode index and the frame index, so a test can check which
rows a sample came from. `synth_layout` writes the files.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from .marker import ROWS, marker_cell

log = logging.getLogger(__name__)

LIBERO_TASKS = (
    "put the black bowl on the plate",
    "open the top drawer of the cabinet",
    "pick up the alphabet soup and place it in the basket",
    "turn on the stove",
)
VERSIONS = ("v2.0", "v2.1", "v3.0")
CODECS = ("av1", "h264")


@dataclass(kw_only=True)
class SynthConfig:
    """What `write_synthetic_dataset` writes. Defaults are the LIBERO-like preset."""

    episodes: int = 10
    """Number of episodes."""
    episode_length: int = 200
    """Frames in the longest episode; with `vary_length` others are up to 20% shorter."""
    vary_length: bool = True
    """Give episodes different lengths (deterministic), so episode edges fall at different places."""
    fps: int = 20
    """Frames per second of the data and the videos."""
    image_size: int = 256
    """Height and width of every camera (>= 64; 64 makes fast CPU demos), unless `camera_sizes` is set."""
    cameras: tuple[str, ...] = ("image", "wrist_image")
    """Camera names; features are `observation.images.<name>`."""
    camera_sizes: tuple[tuple[int, int], ...] | None = None
    """(height, width) of each camera, in `cameras` order: cameras of mixed sizes and aspect ratios. Even
    numbers, width >= 64, height >= width / 4 (room for the frame marker). None: `image_size` squares."""
    state_dim: int = 8
    """Size of `observation.state`."""
    action_dim: int = 7
    """Size of `action`."""
    tasks: tuple[str, ...] = LIBERO_TASKS
    """Task strings; episode e performs task e % len(tasks)."""
    version: str = "v2.1"
    """LeRobot layout: "v2.0" / "v2.1" (a file per episode; v2.0 without per-episode statistics) or
    "v3.0" (episodes concatenated in shared files)."""
    codec: str = "av1"
    """Video codec: "av1" (LeRobot's default) or "h264"."""
    gop: int = 2
    """Keyframe interval in frames (LeRobot uses 2)."""
    episodes_per_file: int = 4
    """v3.0 only: episodes per data/video file, so small datasets still span several files (unless
    `video_file_size_mb` is set)."""
    video_file_size_mb: float | None = None
    """v3.0 only: size files as LeRobot does instead of `episodes_per_file`: episodes are appended to a
    camera's video file until the next one would reach this many MiB (LeRobot's `video_files_size_in_mb`,
    200 by default), then a new file begins; data files likewise at `data_file_size_mb`. The videos are
    built fast from `pool_episodes` encoded episodes: episode e shows the frames of pool episode
    e % pool_episodes (`synth_sized`)."""
    data_file_size_mb: float = 100.0
    """v3.0 with `video_file_size_mb`: the size limit of data (parquet) files in MiB (LeRobot's
    `data_files_size_in_mb`)."""
    pool_episodes: int = 16
    """With `video_file_size_mb`: how many distinct episodes are encoded; the others copy their frames."""
    seed: int = 0
    """Seed of the image texture and the smooth state/action curves."""
    modality: bool = True
    """Write a `meta/modality.json` (named slices of the state/action vectors); False: a plain LeRobot dataset."""
    stats: bool = True
    """Write statistics (`meta/stats.json`, v2.1's `episodes_stats.jsonl`, v3.0's per-episode `stats/*`
    columns); False writes none, like a dataset whose statistics were never computed."""
    grouped_names: bool = False
    """Declare the `names` of `observation.state` and `action` as named groups ({"eef_pos": [...], ...},
    LIBERO-like where the sizes allow it) instead of one flat list."""

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"SynthConfig.version must be one of {VERSIONS}, got {self.version!r}")
        if self.codec not in CODECS:
            raise ValueError(f"SynthConfig.codec must be one of {CODECS}, got {self.codec!r}")
        for name in ("episodes", "episode_length", "fps", "gop", "episodes_per_file", "pool_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"SynthConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= len(self.cameras) <= 16:
            raise ValueError(f"SynthConfig.cameras must name 1 to 16 cameras, got {len(self.cameras)}")
        self.cameras = tuple(self.cameras)
        if self.camera_sizes is not None:
            self.camera_sizes = tuple((int(h), int(w)) for h, w in self.camera_sizes)
            if len(self.camera_sizes) != len(self.cameras):
                raise ValueError(
                    f"SynthConfig.camera_sizes gives {len(self.camera_sizes)} sizes for {len(self.cameras)} cameras"
                )
        for height, width in self.sizes():
            name = "camera_sizes" if self.camera_sizes else "image_size"
            cell = marker_cell(width)  # raises for images too small to carry a marker
            if height % 2 or width % 2:
                raise ValueError(f"SynthConfig.{name} must be even (yuv420p), got {height}x{width}")
            if height < ROWS * cell:
                raise ValueError(
                    f"SynthConfig.{name}: {height}x{width} is too flat for the frame marker "
                    f"(height >= {ROWS * cell} at width {width})"
                )
        if self.state_dim < 3 or self.action_dim < 3:
            raise ValueError("SynthConfig.state_dim and action_dim must be >= 3 (they carry row indices)")
        if not self.tasks:
            raise ValueError("SynthConfig.tasks must name at least one task")
        self.tasks = tuple(self.tasks)
        if self.video_file_size_mb is not None:
            if self.version != "v3.0":
                raise ValueError(
                    f"SynthConfig.video_file_size_mb sizes v3.0 files; version is {self.version!r}"
                )
            for name in ("video_file_size_mb", "data_file_size_mb"):
                if not getattr(self, name) > 0:
                    raise ValueError(f"SynthConfig.{name} must be > 0, got {getattr(self, name)}")

    @property
    def sized(self) -> bool:
        """True when v3.0 files are sized by `video_file_size_mb` (and built from a pool of episodes)."""
        return self.video_file_size_mb is not None

    def sizes(self) -> list[tuple[int, int]]:
        """(height, width) of every camera, in `cameras` order."""
        return list(self.camera_sizes or [(self.image_size, self.image_size)] * len(self.cameras))

    def lengths(self) -> list[int]:
        """Length of every episode (sized v3.0: episode e has the length of pool episode e % pool_episodes)."""
        if not self.vary_length:
            return [self.episode_length] * self.episodes
        spread = max(1, self.episode_length // 5)
        period = self.pool_episodes if self.sized else self.episodes
        return [max(1, self.episode_length - ((e % period) * 7) % spread) for e in range(self.episodes)]

    def with_(self, **changes: object) -> SynthConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


SYNTH_PRESETS: dict[str, SynthConfig] = {
    "libero": SynthConfig(),
    "tiny": SynthConfig(episodes=3, episode_length=24, image_size=64),
}


def write_synthetic_dataset(
    root: str | Path,
    config: SynthConfig | None = None,
    overwrite: bool = False,
    progress: bool = True,
    workers: int | None = None,
) -> Path:
    """Write a synthetic LeRobot dataset (v2.0, v2.1 or v3.0 layout, real mp4 files) under `root`.

    Besides the LeRobot files it writes `meta/stats.json` and a `meta/modality.json` that names slices of
    the state and action vectors (unless `stats` / `modality` are off). `workers`: processes that encode
    and write the files of a sized v3.0 dataset (`SynthConfig.video_file_size_mb`; default: one per CPU
    core; 1 writes in this process). Returns the root path.
    """
    from .synth_content import ContentGenerator
    from .synth_layout import write_layout

    cfg = config or SynthConfig()
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{root} exists and is not empty; pass overwrite=True to replace it")
        import shutil

        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    if cfg.sized:
        from .synth_sized import write_sized_v30

        write_sized_v30(root, cfg, progress=progress, workers=workers)
    else:
        write_layout(root, cfg, ContentGenerator(cfg), progress=progress)
    log.info("wrote synthetic %s dataset (%d episodes) to %s", cfg.version, cfg.episodes, root)
    return root
