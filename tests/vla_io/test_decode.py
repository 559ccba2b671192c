"""Video readers: exact frames at random sorted indices (against PyAV), decoder reuse, backend errors."""

from __future__ import annotations

import os
import signal
import time
import weakref

import numpy as np
import pytest
from vla_io import available_backends, open_reader
from vla_io.decode.readers import ReaderCache

GR1_VIDEO = "videos/chunk-000/observation.images.ego_view/episode_000003.mp4"


def _files(synth_root, gr1_root):
    return [
        str(synth_root("v3.0", "av1") / "videos/observation.images.image/chunk-000/file-000.mp4"),
        str(
            synth_root("v2.1", "h264") / "videos/chunk-000/observation.images.wrist_image/episode_000001.mp4"
        ),
        str(gr1_root / GR1_VIDEO),
    ]


@pytest.mark.parametrize("backend", ["torchcodec", "pyav"])
def test_reader_returns_exact_frames_and_times(synth_root, gr1_root, ref_frame, backend, require_backend):
    require_backend(backend)
    rng = np.random.default_rng(0)
    for path in _files(synth_root, gr1_root):
        reader = open_reader(path, backend)
        for _ in range(4):  # one long-lived reader, several sorted batches, forwards and backwards
            indices = np.unique(rng.integers(0, reader.num_frames, size=5)).tolist()
            frames, pts = reader.frames_at(indices)
            assert frames.shape[0] == len(indices) and frames.dtype.is_floating_point is False
            for frame, seconds in zip(frames, pts):
                assert np.array_equal(frame.numpy(), ref_frame(path, float(seconds)))
            np.testing.assert_allclose(pts, np.asarray(indices) / 20, atol=1e-4)


def test_pyav_reader_rejects_out_of_range(synth_root):
    path = synth_root("v2.1", "av1") / "videos/chunk-000/observation.images.image/episode_000000.mp4"
    reader = open_reader(str(path), "pyav")
    with pytest.raises(IndexError, match="outside"):
        reader.frames_at([reader.num_frames])


def test_reader_cache_reuses_and_evicts(synth_root):
    root = synth_root("v2.1", "av1")
    paths = [str(p) for p in sorted((root / "videos/chunk-000/observation.images.image").glob("*.mp4"))]
    cache = ReaderCache(max_open=2, backend="pyav")
    first = cache.get(paths[0])
    assert cache.get(paths[0]) is first and cache.opened == 1
    cache.get(paths[1])
    cache.get(paths[2])  # evicts paths[0], the least recently used
    assert cache.get(paths[0]) is not first and cache.opened == 4


def test_reader_cache_starts_empty_after_fork_and_never_frees_the_inherited_readers(synth_root):
    path = str(synth_root("v2.1", "av1") / "videos/chunk-000/observation.images.image/episode_000000.mp4")
    cache = ReaderCache(backend="pyav")
    cache.get(path).frames_at([0, 3])  # decoding leaves FFmpeg state (a swscale thread pool) in the reader
    parent_reader = weakref.ref(cache.get(path))  # only the cache holds it, as in a pipeline's dataset
    pid = os.fork()
    if pid == 0:  # child: the inherited decoder must not be reused, nor freed (that blocked forever)
        fresh = cache.get(path) is not parent_reader()
        cache.clear()
        os._exit(0 if fresh else 1)
    deadline = time.monotonic() + 20.0
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child blocked for 20 s on the readers it inherited")
    assert os.WEXITSTATUS(done[1]) == 0


def test_backend_errors(synth_root, tmp_path):
    path = str(synth_root("v2.1", "av1") / "videos/chunk-000/observation.images.image/episode_000000.mp4")
    with pytest.raises(ValueError, match="video backend must be one of"):
        open_reader(path, "decord")
    with pytest.raises(ValueError, match="needs the torchcodec backend"):
        open_reader(path, "pyav", device="cuda")
    with pytest.raises(FileNotFoundError, match="nope.mp4"):
        open_reader(str(tmp_path / "nope.mp4"))
    assert available_backends()[-1] == "pyav"


@pytest.mark.gpu
def test_nvdec_reader_returns_the_right_frames(synth_root, ref_frame):
    pytest.importorskip("torchcodec")
    from vla_io.testing import read_frame_marker

    path = str(synth_root("v2.1", "h264") / "videos/chunk-000/observation.images.image/episode_000002.mp4")
    reader = open_reader(path, "torchcodec", device="cuda")
    frames, pts = reader.frames_at([0, 3, 7, 15])
    assert frames.device.type == "cuda" and frames.dtype.is_floating_point is False
    for frame, seconds in zip(frames.cpu(), pts):
        expected = ref_frame(path, float(seconds))
        # NVDEC converts YUV to RGB with its own kernel: close to FFmpeg's, not bit-identical
        assert np.abs(frame.numpy().astype(int) - expected.astype(int)).mean() < 3
        assert read_frame_marker(frame.numpy())[1] == 0
