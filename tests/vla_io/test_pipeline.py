"""Pipeline: same batches as the synchronous reference, resumable, distributed, no epoch bubble, failures
surface with their traceback and nothing hangs."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from vla_io import EpochSampler, LeRobotDataset, Pipeline, PipelineConfig, WorkerError

pytestmark = pytest.mark.timeout(120)
DELTAS = {"action": [i / 20 for i in range(4)]}


@pytest.fixture(scope="module")
def dataset(synth_root):
    torch.set_num_threads(1)
    return LeRobotDataset(synth_root("v3.0", "av1"), delta_timestamps=DELTAS, progress=False)


def _run(pipe, epochs=1):
    out = []
    for _ in range(epochs):
        out += list(pipe)
    return out


@pytest.mark.parametrize(
    ("workers", "affinity", "reuse"),
    [(0, None, True), (2, None, True), (2, True, False), (3, True, True), (2, False, False)],
)
def test_async_equals_synchronous_reference(dataset, batches_equal, workers, affinity, reuse):
    # all batches are kept until the end: a worker reusing memory too early would change earlier ones
    ref = _run(Pipeline(dataset, 4, synchronous=True, device="cpu", seed=5), 2)
    options = {"affinity": affinity, "reuse_shared_memory": reuse}
    with Pipeline(dataset, 4, num_workers=workers, seed=5, device="cpu", **options) as pipe:
        got = _run(pipe, 2)
    assert len(got) == len(ref) == 2 * (len(dataset) // 4)
    for a, b in zip(ref, got):
        batches_equal(a, b)
    assert ref[0]["observation.images.image"].dtype == torch.uint8  # frames travel as uint8


def test_order_is_a_permutation_fixed_by_the_seed(dataset):
    def order(seed):
        return torch.cat(
            [b["index"] for b in Pipeline(dataset, 4, synchronous=True, device="cpu", seed=seed)]
        ).tolist()

    a, b = order(1), order(1)
    assert a == b and a != order(2)
    assert len(set(a)) == len(a) == (len(dataset) // 4) * 4


def test_resume_mid_epoch_reproduces_the_rest(dataset, batches_equal):
    ref = _run(Pipeline(dataset, 4, synchronous=True, device="cpu", seed=3), 2)
    n = len(ref) // 2
    with Pipeline(dataset, 4, num_workers=2, seed=3, device="cpu") as pipe:
        it = iter(pipe)
        for _ in range(n - 3):
            next(it)
        state = pipe.state_dict()
    assert state["epoch"] == 0 and state["batch"] == n - 3
    with Pipeline(dataset, 4, num_workers=2, seed=3, device="cpu") as resumed:
        resumed.load_state_dict(state)
        rest = _run(resumed, 2)  # the rest of epoch 0, then epoch 1
    for a, b in zip(ref[n - 3 :], rest):
        batches_equal(a, b)
    with pytest.raises(ValueError, match="seed=3"):
        Pipeline(dataset, 4, seed=4, device="cpu").load_state_dict(state)


def test_state_after_the_last_batch_points_at_the_next_epoch(dataset):
    pipe = Pipeline(dataset, 4, synchronous=True, device="cpu")
    for _ in pipe:
        pass
    assert pipe.state_dict()["epoch"] == 1 and pipe.state_dict()["batch"] == 0
    pipe2 = Pipeline(dataset, 4, synchronous=True, device="cpu")
    it = iter(pipe2)
    for _ in range(len(pipe2)):
        next(it)  # stop right after the last batch, without exhausting the iterator
    assert pipe2.epoch == 1 and len(list(pipe2)) == len(pipe2)


def test_distributed_ranks_are_disjoint_and_equal(dataset):
    seen = []
    for rank in range(3):
        pipe = Pipeline(dataset, 2, synchronous=True, device="cpu", seed=9, rank=rank, world_size=3)
        seen.append(torch.cat([b["index"] for b in pipe]).tolist())
    assert len({len(s) for s in seen}) == 1
    assert not set(seen[0]) & set(seen[1]) and not set(seen[1]) & set(seen[2])
    # a sample's seed does not depend on the world size
    single = EpochSampler(len(dataset), 1, seed=9, world_size=1)
    split = EpochSampler(len(dataset), 1, seed=9, rank=1, world_size=3)
    seeds = {
        int(single.task(0, b).indices[0]): int(single.task(0, b).seeds[0])
        for b in range(single.batches_per_epoch)
    }
    for b in range(split.batches_per_epoch):
        task = split.task(0, b)
        assert seeds[int(task.indices[0])] == int(task.seeds[0])


def test_padding_without_drop_last(dataset):
    sampler = EpochSampler(len(dataset), 4, world_size=2, drop_last=False, shuffle=False)
    sizes = [len(sampler.task(0, b).indices) for b in range(sampler.batches_per_epoch)]
    assert sum(sizes) == -(-len(dataset) // 2) and sizes[-1] <= 4


def test_no_bubble_at_the_epoch_boundary(dataset):
    with Pipeline(dataset, 4, num_workers=2, seed=0, device="cpu") as pipe:
        last = len(pipe) - 1
        for i, _ in enumerate(pipe):
            if i == last:
                submitted = list(pipe._producer.submitted)
        # when the consumer took the last batch of epoch 0, epoch 1 was already being loaded
        assert (1, 0) in submitted and (1, 1) in submitted
        started = time.perf_counter()
        next(iter(pipe))
        assert time.perf_counter() - started < 1.0


def test_transform_and_device_transform_run_in_order(dataset):
    calls = []

    def transform(batch):
        calls.append("host")
        return {"state": batch["observation.state"] * 2, "seed": batch["sample_seed"], "text": batch["task"]}

    def device_transform(batch):
        return {**batch, "state": batch["state"] + 1}

    ref = list(Pipeline(dataset, 4, synchronous=True, device="cpu", seed=1))
    with Pipeline(
        dataset,
        4,
        num_workers=1,
        seed=1,
        device="cpu",
        transform=transform,
        device_transform=device_transform,
    ) as pipe:
        got = list(pipe)
        stats = pipe.stats()
    for a, b in zip(ref, got):
        assert torch.equal(a["observation.state"] * 2 + 1, b["state"]) and a["task"] == b["text"]
    assert len(calls) >= len(ref)
    assert (
        stats["batches"] == len(ref)
        and all(stats[f"l{i}_wait_s"] >= 0 for i in (1, 2, 3))
        and stats["transform_s"] > 0
    )


def test_host_threads_use_one_torch_thread_and_leave_the_callers_alone(dataset):
    torch.set_num_threads(2)
    seen = []

    def transform(batch):
        seen.append(torch.get_num_threads())
        return batch

    try:
        with Pipeline(dataset, 4, num_workers=1, device="cpu", transform=transform) as pipe:
            batch = next(iter(pipe))
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert batch["sample_seed"].device.type == "cpu"


class _Exploding:
    """Wraps a dataset; loading a batch that contains `bad` raises (or kills the worker)."""

    def __init__(self, dataset, bad, how):
        self.dataset, self.bad, self.how = dataset, bad, how

    def __len__(self):
        return len(self.dataset)

    def get_batch(self, indices, **kw):
        if self.bad in list(indices):
            if self.how == "raise":
                raise RuntimeError(f"boom at sample {self.bad}")
            os._exit(3)
        return self.dataset.get_batch(indices, **kw)


def _bad_sample(dataset, batch):
    return int(EpochSampler(len(dataset), 4, seed=0).task(0, batch).indices[0])


def test_worker_exception_surfaces_with_its_traceback(dataset):
    pipe = Pipeline(_Exploding(dataset, _bad_sample(dataset, 2), "raise"), 4, num_workers=2, device="cpu")
    with pytest.raises(WorkerError) as info:
        list(pipe)
    text = str(info.value)
    assert "RuntimeError: boom at sample" in text and "Traceback" in text and "batch (0, 2)" in text
    pipe.close()


def test_worker_death_is_reported_not_hung(dataset):
    pipe = Pipeline(_Exploding(dataset, _bad_sample(dataset, 1), "exit"), 4, num_workers=2, device="cpu")
    started = time.perf_counter()
    with pytest.raises(WorkerError, match=r"died \(exit code 3\)"):
        list(pipe)
    pipe.close()
    assert time.perf_counter() - started < 30


def test_transform_exception_reaches_the_consumer(dataset):
    def transform(batch):
        raise ValueError("processor rejected the batch")

    with pytest.raises(ValueError, match="processor rejected"):
        list(Pipeline(dataset, 4, num_workers=0, device="cpu", transform=transform))


def test_generic_dataset_with_getitem_only():
    class Squares:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"x": torch.tensor([i, i * i]), "name": f"s{i}"}

    with Pipeline(Squares(), 3, num_workers=1, shuffle=False, device="cpu") as pipe:
        batches = list(pipe)
    assert [b["x"][:, 0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert batches[1]["name"] == ["s3", "s4", "s5"] and batches[0]["sample_seed"].dtype == torch.int64


def test_config_validation_names_the_field(dataset):
    with pytest.raises(ValueError, match="PipelineConfig.rank"):
        PipelineConfig(batch_size=2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="PipelineConfig.start_method"):
        PipelineConfig(batch_size=2, start_method="thread")
    with pytest.raises(ValueError, match="no full batch"):
        Pipeline(dataset, 1000, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            Pipeline(dataset, 4, device="cuda")


@pytest.mark.gpu
def test_gpu_delivery_matches_reference(dataset, batches_equal):
    from vla_io import ImageAugment, ImageTransformConfig

    augment = ImageAugment(ImageTransformConfig(size=(48, 48), brightness=0.2), ["observation.images.image"])
    ref = list(Pipeline(dataset, 4, synchronous=True, device="cuda", seed=2, device_transform=augment))
    with Pipeline(dataset, 4, num_workers=2, seed=2, device="cuda", device_transform=augment) as pipe:
        got = list(pipe)
    for a, b in zip(ref, got):
        assert (
            b["observation.images.image"].device.type == "cuda"
            and b["observation.images.image"].dtype == torch.float32
        )
        torch.testing.assert_close(a["observation.images.image"], b["observation.images.image"])
        assert torch.equal(a["action"], b["action"]) and a["action"].device.type == "cuda"
        assert torch.equal(a["sample_seed"], b["sample_seed"]) and b["sample_seed"].device.type == "cpu"
    assert np.isfinite(pipe.stats()["l3_wait_s"])


def test_affinity_is_automatic(dataset, synth_root):
    from vla_io.pipeline.routing import use_affinity

    assert not dataset.prefers_affinity()  # 4 files, 256 decoders per worker
    few = LeRobotDataset(synth_root("v2.1", "av1"), max_open_videos=2, progress=False)
    assert few.prefers_affinity() and use_affinity(few, None) and not use_affinity(few, False)
    assert not use_affinity(object(), True)  # a dataset without affinity() cannot be routed


def test_affinity_routes_each_file_group_to_one_worker(dataset):
    from vla_io.pipeline.routing import AffinityRouter, assemble, plan_parts

    sampler = EpochSampler(len(dataset), 16, seed=4)
    router = AffinityRouter(dataset, 3)
    owner = {}
    for b in range(sampler.batches_per_epoch):
        task = sampler.task(0, b)
        plan = plan_parts(task, 3, router, turn=b)
        assert sorted(np.concatenate([p for _, p in plan]).tolist()) == list(range(16))
        for worker, positions in plan:
            for group in dataset.affinity(task.indices[positions]):
                assert owner.setdefault(int(group), worker) == worker
        parts = [dataset.get_batch(task.indices[p]) for _, p in plan]
        whole = dataset.get_batch(task.indices)
        assert torch.equal(
            assemble(parts, [p for _, p in plan])["observation.images.image"],
            whole["observation.images.image"],
        )
    assert len(set(owner.values())) == 2  # episodes 0-1 share their files, episode 2 has its own
    ((worker, positions),) = plan_parts(task, 3, None, turn=5)
    assert worker == 2 and positions.tolist() == list(range(16))


def test_affinity_balances_samples_across_workers():
    from vla_io.pipeline.routing import AffinityRouter

    class Episodes:  # 150 episodes of 50..400 frames, like a real dataset
        def __init__(self):
            lengths = np.random.default_rng(0).integers(50, 400, size=150)
            self.episode = np.repeat(np.arange(150), lengths)

        def __len__(self):
            return len(self.episode)

        def affinity(self, indices):
            return self.episode[np.asarray(indices)]

    data = Episodes()
    router = AffinityRouter(data, 14)
    assert router.load.sum() == len(data) and router.load.max() / router.load.mean() < 1.03
    owners = router(np.arange(len(data)))
    assert np.array_equal(np.bincount(owners, minlength=14), router.load)
    assert np.array_equal(router.owners, AffinityRouter(data, 14).owners)  # deterministic


def test_cuda_decoding_refuses_forked_workers(synth_root):
    ds = LeRobotDataset(synth_root("v2.1", "av1"), decode_device="cuda", progress=False)  # opens nothing yet
    with pytest.raises(ValueError, match="start_method='spawn'"):
        Pipeline(ds, 4, num_workers=2, start_method="fork", device="cpu")


def test_readme_example_runs(dataset):
    from vla_io import ImageAugment, ImageTransformConfig

    cameras = dataset.video_keys

    def processor(batch):
        return {
            "images": batch[cameras[0]],
            "wrist": batch[cameras[1]],
            "state": batch["observation.state"],
            "action": batch["action"],
            "action_is_pad": batch["action_is_pad"],
            "sample_seed": batch["sample_seed"],
            "text": batch["task"],
        }

    augment = ImageAugment(
        ImageTransformConfig(
            size=(32, 32), crop_scale=(0.9, 1.0), brightness=0.2, mean=(0.5,) * 3, std=(0.5,) * 3
        ),
        keys=["images", "wrist"],
        stack_as="pixel_values",
    )
    with Pipeline(
        dataset, batch_size=4, transform=processor, device_transform=augment, num_workers=1, device="cpu"
    ) as pipe:
        batch = next(iter(pipe))
        state = pipe.state_dict()
    assert batch["pixel_values"].shape == (4, 2, 3, 32, 32) and batch["pixel_values"].dtype == torch.float32
    assert batch["action"].shape == (4, 4, 7) and len(batch["text"]) == 4 and state["batch"] == 1
    ref = next(
        iter(
            Pipeline(
                dataset, 4, transform=processor, device_transform=augment, synchronous=True, device="cpu"
            )
        )
    )
    assert torch.equal(ref["pixel_values"], batch["pixel_values"])  # seeded augmentation: same in both modes


@pytest.mark.gpu
def test_cuda_decoding_in_the_host_thread(synth_root):
    from vla_io.testing import read_frame_marker

    ds = LeRobotDataset(synth_root("v2.1", "h264"), decode_device="cuda", image_dtype="uint8", progress=False)
    with Pipeline(ds, 4, num_workers=0, device="cuda", seed=1) as pipe:
        batch = next(iter(pipe))
    frames = batch["observation.images.image"]
    assert frames.device.type == "cuda"
    assert [read_frame_marker(f.cpu().numpy())[0] for f in frames] == batch["index"].tolist()


def test_sample_windows_async_equals_synchronous(dataset, batches_equal):
    ref = _run(Pipeline(dataset, 4, synchronous=True, device="cpu", seed=6, sample_window=4), 1)
    with Pipeline(dataset, 4, num_workers=2, seed=6, device="cpu", sample_window=4) as pipe:
        got = _run(pipe, 1)
    for a, b in zip(ref, got):
        batches_equal(a, b)
    index = torch.cat([b["index"] for b in ref]).numpy()
    assert (np.diff(index) == 1).mean() > 0.5  # mostly neighbouring frames
    with pytest.raises(ValueError, match="episode_bounds"):
        Pipeline(list(range(10)), 2, sample_window=2, device="cpu")
