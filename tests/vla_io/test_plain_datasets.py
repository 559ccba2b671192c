"""Plain LeRobot datasets (no GR00T files, no statistics, cameras of mixed sizes), read-only: frames,
statistics computed once and cached outside the dataset, letterboxed images of any shape."""

from __future__ import annotations

import errno
import json
import warnings

import numpy as np
import pytest
import torch
from _readonly import read_only
from vla_io import (
    ImageAugment,
    ImageTransformConfig,
    LeRobotDataset,
    dataset_stats,
    write_synthetic_dataset,
)
from vla_io.augment.backend_choice import auto_backend
from vla_io.dataset import stats_cache
from vla_io.dataset.stats import feature_stats
from vla_io.dataset.stats_cache import stats_cache_path
from vla_io.testing import SynthConfig, read_frame_marker

MIXED = SynthConfig(
    episodes=3, episode_length=16, cameras=("front", "wrist"), camera_sizes=((48, 96), (64, 64)),
    modality=False, stats=False, codec="h264", episodes_per_file=2,
)  # fmt: skip


@pytest.fixture(scope="module", params=["v2.0", "v2.1", "v3.0"])
def plain(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"plain-{request.param}") / "ds"
    return write_synthetic_dataset(root, MIXED.with_(version=request.param), progress=False)


def test_plain_layout_has_no_gr00t_or_statistics_files(plain):
    names = {p.name for p in (plain / "meta").iterdir()}
    assert not names & {"modality.json", "stats.json", "episodes_stats.jsonl", "relative_stats.json"}
    info = json.loads((plain / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["shape"] == [48, 96, 3]
    assert info["features"]["observation.images.wrist"]["shape"] == [64, 64, 3]


def test_frames_of_mixed_sizes_decode_exactly(plain):
    with read_only(plain):
        ds = LeRobotDataset(plain, image_dtype="uint8", progress=False)
        assert ds.meta.modality is None and ds.meta.stats is None
        batch = ds.get_batch([0, 17, len(ds) - 1])
        assert batch["observation.images.front"].shape == (3, 3, 48, 96)
        assert batch["observation.images.wrist"].shape == (3, 3, 64, 64)
        for camera, key in enumerate(("observation.images.front", "observation.images.wrist")):
            markers = [read_frame_marker(f.numpy()) for f in batch[key]]
            assert markers == [(int(i), camera) for i in batch["index"]]


def test_statistics_are_computed_once_and_cached_outside(plain, tmp_path):
    cache = tmp_path / "cache"
    with read_only(plain):
        ds = LeRobotDataset(plain, progress=False)
        stats = dataset_stats(ds, ["observation.state", "action"], cache_dir=cache)
        state = ds._table.columns["observation.state"].astype(np.float64)
        expected = feature_stats(state)
        for name in ("min", "max", "mean", "std", "q01", "q99"):
            np.testing.assert_allclose(stats["observation.state"][name], expected[name])
        path = stats_cache_path(ds, cache)
        assert path.is_file() and path.parent == cache
        # the second time they come from the cache (altered here to prove it)
        data = json.loads(path.read_text())
        data["action"]["max"] = [9.0] * 7
        path.write_text(json.dumps(data))
        again = dataset_stats(ds, ["action"], cache_dir=cache)
        assert np.asarray(again["action"]["max"]).tolist() == [9.0] * 7
    with pytest.raises(KeyError, match="no feature 'observation.velocity'"):
        dataset_stats(ds, ["observation.velocity"], cache_dir=cache)


def _file_in_place_of_the_cache_folder(tmp_path, monkeypatch, ds):
    """Real, and root hits it too: $VLA_IO_CACHE names an existing regular file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("VLA_IO_CACHE", str(blocker))
    return str(blocker / "stats"), "set VLA_IO_CACHE"


def _folder_in_place_of_the_cache_file(tmp_path, monkeypatch, ds):
    """Real, and root hits it too: the cache file's name is taken by a folder, so the final rename fails
    (after the temporary file was written: it must not be left behind)."""
    monkeypatch.setenv("VLA_IO_CACHE", str(tmp_path / "cache"))
    stats_cache_path(ds).mkdir(parents=True)
    return str(tmp_path / "cache" / "stats"), "set VLA_IO_CACHE"


def _read_only_folder(tmp_path, monkeypatch, ds):
    """Simulated: what a read-only cache folder raises for a non-root user. Tests run as root, whom
    `chmod` does not stop, so the write itself is made to raise that PermissionError."""
    cache = tmp_path / "read-only"

    def refuse(path, data):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(stats_cache, "write_json_atomic", refuse)
    return str(cache), "pass a writable cache_dir", cache


@pytest.mark.parametrize(
    "unwritable", [_file_in_place_of_the_cache_folder, _folder_in_place_of_the_cache_file, _read_only_folder]
)
def test_statistics_are_computed_when_the_cache_cannot_be_written(plain, tmp_path, monkeypatch, unwritable):
    # Before: the PermissionError / NotADirectoryError of the cache write ended the run (training included).
    ds = LeRobotDataset(plain, progress=False)
    folder, how, *cache_dir = unwritable(tmp_path, monkeypatch, ds)
    kwargs = {"cache_dir": cache_dir[0]} if cache_dir else {}
    with read_only(plain), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = dataset_stats(ds, ["observation.state"], **kwargs)
        # computed again (nothing was cached), without a second warning
        second = dataset_stats(ds, ["observation.state", "action"], **kwargs)
    expected = feature_stats(ds._table.columns["observation.state"].astype(np.float64))
    for stats in (first, second):
        np.testing.assert_allclose(stats["observation.state"]["mean"], expected["mean"])
    assert set(second) == {"observation.state", "action"}
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert f"could not cache them in {folder} (" in messages[0] and how in messages[0]
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no half-written temporary files


def test_own_statistics_are_used_when_complete(synth_root, tmp_path):
    ds = LeRobotDataset(synth_root("v2.1", "h264"), progress=False)  # has stats.json
    stats = dataset_stats(ds, ["observation.state"], cache_dir=tmp_path)
    np.testing.assert_array_equal(
        stats["observation.state"]["max"], ds.meta.stats["observation.state"]["max"]
    )
    assert not list(tmp_path.iterdir())  # nothing computed, nothing cached


def test_letterboxed_cameras_of_any_shape(plain):
    ds = LeRobotDataset(plain, image_dtype="uint8", progress=False)
    batch = ds.get_batch([0, 1, 2, 3])
    cfg = ImageTransformConfig(size=(56, 56), letterbox=True, crop_position="center", crop_scale=(0.9, 0.9))
    augment = ImageAugment(cfg, ["observation.images.front", "observation.images.wrist"], stack_as="pixels")
    out = augment(batch)["pixels"]
    assert out.shape == (4, 2, 3, 56, 56)
    # front (48x96) got black bars of 24 rows above and below: the top and bottom rows are black
    assert out[:, 0, :, 0].abs().max() == 0 and out[:, 0, :, -1].abs().max() == 0
    assert out[:, 0, :, 28].float().mean() > 0.1
    assert out[:, 1, :, 0].float().mean() > 0.1  # the square wrist camera has no bars
    # the centre crop and letterbox are deterministic; each camera alone gives the same result
    alone = ImageAugment(cfg, ["observation.images.front"], stack_as="pixels")(batch)["pixels"]
    torch.testing.assert_close(alone[:, 0], out[:, 0])


def test_letterbox_agrees_between_backends(plain):
    pytest.importorskip("nvidia.dali")
    ds = LeRobotDataset(plain, image_dtype="uint8", progress=False)
    batch = ds.get_batch([0, 5, 9])
    cfg = ImageTransformConfig(
        size=(56, 56), letterbox=True, crop_scale=(0.9025, 0.9025), brightness=0.1, contrast=0.1,
        saturation=0.1, hue=36, same_across_views=True, mean=(0.5,) * 3, std=(0.5,) * 3,
    )  # fmt: skip
    keys = ["observation.images.front", "observation.images.wrist"]
    batch["sample_seed"] = torch.tensor([11, 12, 13])
    a = ImageAugment(cfg, keys, backend="torch", stack_as="pixels")(batch)["pixels"]
    b = ImageAugment(cfg, keys, backend="dali", stack_as="pixels")(batch)["pixels"]
    assert a.shape == b.shape == (3, 2, 3, 56, 56)
    assert ((a - b).abs() * 0.5 * 255).max().item() < 0.02  # the backends' tolerance (test_augment.py)


def test_auto_backend_follows_the_recorded_measurement(monkeypatch):
    import vla_io.augment.backend_choice as choice

    monkeypatch.setattr(choice, "MEASURED_FASTER", {})
    assert auto_backend("cuda") == auto_backend("cpu") == "torch"  # nothing measured: torch
    monkeypatch.setattr(choice, "MEASURED_FASTER", {"cuda": "dali"})
    assert auto_backend("cpu") == "torch"
    dali = choice.auto_backend("cuda")
    try:
        import nvidia.dali  # noqa: F401

        assert dali == "dali"
    except ImportError:
        assert dali == "torch"  # measured faster, but not installed here
    augment = ImageAugment(ImageTransformConfig(size=(8, 8)), backend="auto")
    assert augment.backend_for("cpu") == "torch"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_cameras_of_mixed_sizes_on_the_gpu_match_the_cpu(plain, backend):
    """Per-camera letterbox + crop + resize + jitter on the GPU, as a pipeline's device step runs it."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    ds = LeRobotDataset(plain, image_dtype="uint8", progress=False)
    batch = ds.get_batch(list(range(8)))
    keys = ["observation.images.front", "observation.images.wrist"]
    cfg = ImageTransformConfig(
        size=(252, 252), letterbox=True, crop_scale=(0.9025, 0.9025), brightness=0.1, contrast=0.1,
        saturation=0.1, hue=36, same_across_views=True, mean=(0.5,) * 3, std=(0.5,) * 3,
    )  # fmt: skip
    seeds = torch.arange(8) + 100
    cpu = ImageAugment(cfg, keys, stack_as="px")({**batch, "sample_seed": seeds})["px"]
    on_gpu = {k: (v.cuda() if k in keys else v) for k, v in batch.items()}
    gpu = ImageAugment(cfg, keys, backend=backend, stack_as="px")({**on_gpu, "sample_seed": seeds})["px"]
    assert gpu.device.type == "cuda" and gpu.shape == cpu.shape == (8, 2, 3, 252, 252)
    assert ((gpu.cpu() - cpu).abs() * 0.5 * 255).max().item() < 0.1  # as test_augment.py's GPU tolerance
