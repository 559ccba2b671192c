"""torchcodec installed but unable to load FFmpeg: "auto" falls back to PyAV with one warning naming the
cause; an explicit "torchcodec" raises an error that says how to fix it. The loader is monkeypatched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from vla_io import LeRobotDataset, MissingExtraError, Pipeline, open_reader
from vla_io.cli import main
from vla_io.decode import ffmpeg as _ffmpeg

# what torchcodec raises when no FFmpeg it supports is on the loader path (shortened)
LOAD_FAILURE = RuntimeError(
    "Could not load libtorchcodec. Likely causes:\n  1. FFmpeg is not properly installed ...\n"
    "FFmpeg version 8:\nTraceback (most recent call last):\n"
    "OSError: libavutil.so.60: cannot open shared object file: No such file or directory\n"
    "FFmpeg version 7:\nTraceback (most recent call last):\n"
    "OSError: libavutil.so.59: cannot open shared object file: No such file or directory\n"
)


@pytest.fixture
def loader(monkeypatch):
    """set(error): make torchcodec's loading raise `error` (None: load normally); caches are reset."""

    def fail(error):
        def load():
            raise error

        monkeypatch.setattr(_ffmpeg, "_load_torchcodec", load)
        _ffmpeg.torchcodec_error.cache_clear()
        _ffmpeg._warn_fallback.cache_clear()

    yield fail
    _ffmpeg.torchcodec_error.cache_clear()
    _ffmpeg._warn_fallback.cache_clear()


def _video(root) -> str:
    return str(root / "videos/chunk-000/observation.images.image/episode_000000.mp4")


def test_auto_falls_back_to_pyav_with_one_warning(loader, synth_root, ref_frame):
    root = synth_root("v2.1", "av1")
    loader(LOAD_FAILURE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = LeRobotDataset(root, image_dtype="uint8", progress=False)
        again = LeRobotDataset(root, image_dtype="uint8", progress=False)
        reader = open_reader(_video(root))
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "libavutil.so.60" in messages[0] and "PyAV" in messages[0] and "LD_LIBRARY_PATH" in messages[0]
    assert ds.video_backend == again.video_backend == "pyav" and type(reader).__name__ == "PyAVReader"
    frame = ds[5]["observation.images.image"]
    assert (frame.numpy() == ref_frame(_video(root), 5 / ds.fps)).all()


def test_explicit_torchcodec_says_how_to_fix(loader, synth_root):
    root = synth_root("v2.1", "av1")
    loader(LOAD_FAILURE)
    for make in (
        lambda: LeRobotDataset(root, video_backend="torchcodec", progress=False),
        lambda: open_reader(_video(root), "torchcodec"),
        lambda: LeRobotDataset(root, decode_device="cuda", progress=False),  # NVDEC needs torchcodec
    ):
        with pytest.raises(MissingExtraError) as info:
            make()
        text = str(info.value)
        assert "libavutil.so.60, libavutil.so.59" in text and "Traceback" not in text
        assert "LD_LIBRARY_PATH" in text and "ffmpeg-libs" in text and "apt-get install ffmpeg" in text


def test_torchcodec_not_installed(loader, synth_root):
    root = synth_root("v2.1", "av1")
    loader(ModuleNotFoundError("No module named 'torchcodec'"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an optional extra not installed: PyAV without a warning
        assert LeRobotDataset(root, progress=False).video_backend == "pyav"
    with pytest.raises(MissingExtraError, match=r"pip install 'vla-io\[torchcodec\]'"):
        LeRobotDataset(root, video_backend="torchcodec", progress=False)


def test_forked_pyav_workers_deliver_after_the_parent_decoded(synth_root, batches_equal):
    """The PyAV fallback with fork workers: the parent decoded first (a synchronous run, a look at a
    sample), so each worker inherits open PyAV readers. A worker used to free them on its first read and
    block forever inside FFmpeg (swscale's thread pool belongs to the parent), until the pipeline's
    timeout. Now it sets them aside and opens its own; the first batch comes at once."""
    ds = LeRobotDataset(synth_root("v2.1", "h264"), image_dtype="uint8", video_backend="pyav", progress=False)
    options = dict(num_workers=1, start_method="fork", device="cpu", shuffle=False, timeout_s=20.0)
    reference = ds.get_batch(np.arange(4))  # the parent opens (and decodes with) PyAV readers
    assert type(ds._fetcher.readers.get(_video(synth_root("v2.1", "h264")))).__name__ == "PyAVReader"
    started = time.monotonic()
    with Pipeline(ds, 4, **options) as pipe:
        first = next(iter(pipe))  # before the fix: WorkerTimeoutError after 20 s
    assert time.monotonic() - started < 20.0
    del first["sample_seed"]
    batches_equal(reference, first)


def test_summarize_other_failures():
    assert "undefined symbol _ZN3c10" in _ffmpeg.summarize(OSError("x.so: undefined symbol: _ZN3c10abc"))
    assert _ffmpeg.summarize(RuntimeError("\n  something else\nmore")) == "something else"


def test_ffmpeg_libs_makes_pyav_ffmpeg_loadable(tmp_path, capsys):
    """The fix the error message gives: PyAV's FFmpeg linked under standard names loads in torchcodec."""
    pytest.importorskip("torchcodec")
    import av

    if not (Path(av.__file__).resolve().parent.parent / "av.libs").is_dir():
        pytest.skip("PyAV without bundled libraries")
    assert main(["ffmpeg-libs", str(tmp_path / "libs")]) == 0
    assert f"LD_LIBRARY_PATH={tmp_path / 'libs'}" in capsys.readouterr().out
    assert any(p.name.startswith("libavutil.so.") for p in (tmp_path / "libs").iterdir())
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "libs")}
    code = "import torchcodec; assert torchcodec.ffmpeg_major_version is not None"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
