"""Training batches read from a prefix cache (`prefix_cache.store.FeatureStore`) instead of decoded video.

The sample order is vla-io's `EpochSampler` with the settings the video pipeline uses (seed, shuffle, rank,
world size, whole batches), so a cached run sees the samples an uncached run sees, in the same order. Epoch e
reads augmentation variant e mod K. A background thread gathers each batch's rows into page-locked host
buffers and copies them to the device on a copy stream; the training stream waits on an event, not on the
host. The position (epoch, batch) goes into checkpoints like the pipeline's."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

import torch

from .store import FeatureStore

PER_VARIANT = ("hidden", "scale")
"""Arrays with one entry per augmentation variant; the others hold one per sample."""
PREFIX = "prefix_"
"""Batch keys of the features: prefix_hidden, prefix_scale (fp8), prefix_valid, prefix_image_mask."""
FEATURE_ARRAYS = ("hidden", "scale", "valid", "image_mask")


def batch_key(name: str) -> str:
    """The batch key an array travels under (the features prefixed, the processor's outputs as they are)."""
    return PREFIX + name if name in FEATURE_ARRAYS else name


class CachedSource:
    """An endless, resumable BatchSource over a FeatureStore (see the module docstring)."""

    def __init__(
        self, store: FeatureStore, *, batch_size: int, seed: int, shuffle: bool, rank: int, world_size: int,
        device: torch.device, ahead: int = 2,
    ) -> None:  # fmt: skip
        import vla_io

        if device.type == "cuda" and device.index is None:  # the thread sets its device by index
            device = torch.device("cuda", torch.cuda.current_device())
        self.store, self.device, self.ahead = store, device, ahead
        self.variants = int(store.meta["variants"])
        self.sampler = vla_io.EpochSampler(
            int(store.meta["num_samples"]), batch_size, seed=seed, rank=rank, world_size=world_size,
            shuffle=shuffle, drop_last=True,
        )  # fmt: skip
        self.settings = {"seed": seed, "world_size": world_size, "batch_size": batch_size, "shuffle": shuffle}
        self.position = (0, 0)
        """(epoch, batch) of the next batch to deliver."""
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._seconds = 0.0
        self._reported = 0.0

    # ------------------------------------------------------------------------------- BatchSource
    def __next__(self) -> dict[str, Any]:
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._thread = None
            raise item
        tag, batch, event = item
        if event is not None:  # the copy stream's work: the training stream waits on the device only
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for tensor in batch.values():
                tensor.record_stream(stream)
        epoch, index = tag
        self.position = (epoch, index + 1) if index + 1 < self.sampler.batches_in(epoch) else (epoch + 1, 0)
        return batch

    def state_dict(self) -> dict[str, Any]:
        epoch, index = self.position
        return {
            "epoch": epoch,
            "batch": index,
            "epoch_start": self.sampler.epoch_start(epoch),
            "consumed": self.sampler.consumed(epoch, index),
            "num_samples": self.sampler.num_samples,
            "drop_last": True,
            "sample_window": 1,
            "skipped_samples": 0,
            "prefix_cache": self.store.meta["fingerprint"],
            **self.settings,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (the pipeline's or this source's): at another world size or batch
        size the epoch continues at the place of its global order the saved ranks had reached together, as
        vla-io's pipeline does."""
        mine = self.state_dict()
        for name in ("seed", "shuffle", "num_samples"):
            if name in state and state[name] != mine[name]:
                raise ValueError(
                    f"data position has {name}={state[name]!r}, the prefix cache's has {mine[name]!r}"
                )
        self.close()
        epoch, index = int(state["epoch"]), int(state["batch"])
        start = int(state.get("epoch_start", 0))
        same_shape = all(state.get(k, mine[k]) == mine[k] for k in ("world_size", "batch_size"))
        if not same_shape:
            start, index = int(state["consumed"]), 0
        self.sampler.start_epoch_at(epoch, start)
        if index >= self.sampler.batches_in(epoch):  # the rest is less than a batch per rank: dropped
            self.sampler.start_epoch_at(epoch + 1, 0)
            epoch, index = epoch + 1, 0
        self.position = (epoch, index)

    def timings(self) -> dict[str, float]:
        # The gather and the copy to the device, as the thread measured them.
        total = self._seconds
        delta, self._reported = max(0.0, total - self._reported), total
        return {"h2d": delta}

    def close(self) -> None:
        """Stop the thread and drop the batches it had ready."""
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread = None
        self._queue = queue.Queue(maxsize=self.ahead)
        self._stop = threading.Event()

    # ---------------------------------------------------------------------------------- the thread
    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(self.position, self._stop, self._queue), name="prefix-cache", daemon=True
        )
        self._thread.start()

    def _run(self, position: tuple[int, int], stop: threading.Event, out: queue.Queue) -> None:
        cuda = self.device.type == "cuda"
        try:
            if cuda:
                torch.cuda.set_device(self.device)
                stream = torch.cuda.Stream(self.device)
            slots = [_Slot() for _ in range(self.ahead + 2)]  # queued + in use + being filled
            for number, task in enumerate(self.sampler.tasks(*position)):
                started = time.perf_counter()
                slot = slots[number % len(slots)]
                rows = torch.from_numpy(task.indices).long()
                host = slot.fill(self.store, rows, task.epoch % self.variants, pin=cuda)
                event = None
                if cuda:
                    with torch.cuda.stream(stream):
                        batch = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
                        event = slot.copied = torch.cuda.Event()
                        event.record(stream)
                else:
                    batch = host
                self._seconds += time.perf_counter() - started
                while not stop.is_set():
                    try:
                        out.put((task.tag, batch, event), timeout=0.05)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
        except BaseException as err:  # handed to the training thread, which raises it
            out.put(err)


class _Slot:
    """Host buffers for one batch: page-locked and reused on CUDA (after their copy is done)."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.copied: torch.cuda.Event | None = None

    def fill(self, store: FeatureStore, rows: torch.Tensor, variant: int, pin: bool) -> dict[str, Any]:
        if self.copied is not None:
            self.copied.synchronize()  # the previous batch in these buffers has reached the device
        host = {}
        for name, array in store.arrays.items():
            source = array[variant] if name in PER_VARIANT else array
            if not pin:  # CPU training: fresh tensors, the loop may keep a batch
                host[batch_key(name)] = source.index_select(0, rows)
                continue
            shape = (len(rows), *source.shape[1:])
            buffer = self.buffers.get(name)
            if buffer is None or tuple(buffer.shape) != shape:
                buffer = self.buffers[name] = torch.empty(shape, dtype=source.dtype, pin_memory=True)
            torch.index_select(source, 0, rows, out=buffer)
            host[batch_key(name)] = buffer
        return host
