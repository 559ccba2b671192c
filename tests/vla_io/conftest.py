"""Shared fixtures: small synthetic datasets (v2.1 / v3.0, AV1 / H.264) written once per session, the real
gr1-picknplace dataset, and a direct PyAV decode used as the reference for every frame check."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from vla_io.testing import SynthConfig, write_synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
GR1 = REPO / "tests" / "data" / "gr1-picknplace"
VARIANTS = [("v2.1", "av1"), ("v2.1", "h264"), ("v3.0", "av1"), ("v3.0", "h264")]
# three short episodes of different lengths; v3.0 puts two in the first file and one in the second
TINY = SynthConfig(episodes=3, episode_length=20, image_size=64, episodes_per_file=2)


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory):
    """Factory: the root of a synthetic dataset for (version, codec), written on first use."""
    made: dict[tuple[str, str], Path] = {}

    def get(version: str, codec: str) -> Path:
        if (version, codec) not in made:
            root = tmp_path_factory.mktemp(f"synth-{version}-{codec}")
            made[(version, codec)] = write_synthetic_dataset(
                root, TINY.with_(version=version, codec=codec), overwrite=True, progress=False
            )
        return made[(version, codec)]

    return get


@pytest.fixture(params=VARIANTS, ids=[f"{v}-{c}" for v, c in VARIANTS])
def variant_root(request, synth_root) -> Path:
    """Each synthetic variant in turn."""
    return synth_root(*request.param)


@pytest.fixture(scope="session")
def gr1_root() -> Path:
    return GR1


@functools.lru_cache(maxsize=64)
def pyav_frames(path: str) -> dict[int, np.ndarray]:
    """Every frame of a file decoded sequentially by PyAV, keyed by pts in microseconds (rounded)."""
    import av

    out = {}
    with av.open(path) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            out[round(float(frame.pts * stream.time_base) * 1e6)] = frame.to_ndarray(format="rgb24")
    return out


def reference_frame(path: str, seconds: float) -> np.ndarray:
    """The frame PyAV presents at `seconds` in the file, as (C, H, W) uint8."""
    frames = pyav_frames(str(path))
    return frames[round(seconds * 1e6)].transpose(2, 0, 1)


def assert_batches_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key].cpu(), b[key].cpu()), key
        else:
            assert a[key] == b[key], key


@pytest.fixture(scope="session")
def ref_frame():
    """reference_frame(path, seconds) -> (C, H, W) uint8 decoded directly with PyAV."""
    return reference_frame


@pytest.fixture(scope="session")
def batches_equal():
    """assert_batches_equal(a, b): same keys, bit-identical tensors, equal other values."""
    return assert_batches_equal


def skip_without(backend: str) -> None:
    """Skip (with the reason) when a decoder backend cannot load here, e.g. torchcodec without FFmpeg."""
    from vla_io.decode.ffmpeg import torchcodec_error

    if backend == "torchcodec" and torchcodec_error() is not None:
        pytest.skip(f"torchcodec cannot load: {torchcodec_error()}")


@pytest.fixture(scope="session")
def require_backend():
    """require_backend(name) skips the test when that decoder backend is unavailable."""
    return skip_without
