"""Copies of a checkpoint's state in host memory, taken after the update finished, so a background thread can
write them while training changes the originals. The loop queues the copies; it waits for them only where
said below.

Every copy lands in a slot of a `HostPool` (allocated once, pinned on CUDA, reused by every save). The kinds
of copy, by what may change the original next:

- `copy(tree)`: on the current stream. Every later kernel on it (the next step's forward included) is queued
  behind the copy, so no one can change the original first; for the small tensors (random states, the model
  tensors a checkpoint writes).
- `copy(tree, guarded=True)`: state that only the optimizer changes (its fp32 masters and moments, 19.4 GB
  for n1.6-3b), copied to the host on a copy stream of its own, beside the next step's forward and backward.
  When the device has room for it (`device_room`: free memory less the headroom the steps' peak needs), the
  state is first copied on the device, on the current stream (19.4 GB read and written at an H200's
  4.8 TB/s: ~10 ms, an estimate), into one buffer kept from save to save (`checkpoint.snapshot`), and the
  host copies read that snapshot: nothing waits for them. Otherwise
  they read the originals, and `before_update` (an optimizer step pre-hook) makes the stream the update
  runs on wait for them, so the update cannot change a tensor still being copied: the loop then waits only
  as long as the copies (19.4 GB at PCIe 5's ~50 GB/s: ~0.4 s, an estimate) outlast the next step's forward
  and backward. benchmarks/probes/checkpoint_stall.py measures both.
- `keep(tensor)`: a tensor made for this save (ZeRO-1's gathered buckets at more than one rank), copied on
  the copy stream and held until its copy ended; past `held_limit` bytes held, the loop waits for the copies.

With the optimizer on a side stream, `Trainer.save` made the current stream wait for the update first, and
the copy stream waits for the current one before its first copy: the copies read the updated state.
`finish()` returns the function the writer calls before reading the copies: it waits for them to end.
CPU tensors are copied into the pool at once, unless the caller says they are fresh (made for this save).

Each save records where its time went (`parts`: the wait for the pool's reservation, the pool's growth, the
snapshot's allocation and copies, the host copies' launch) and the device memory around it (`memory`).
"""

from __future__ import annotations

import copy as deepcopy
import time
from collections.abc import Callable
from typing import Any

import torch
import vla_overlap

from .host_pool import HostPool
from .snapshot import SnapshotBuffer, layout

GiB = 1 << 30
SNAPSHOT_MARGIN = 2 << 30
"""Device memory left free, beyond the steps' own headroom, when the state is copied on the device first."""


def device_room(device: torch.device, budget_bytes: int | None = None) -> int:
    """Bytes a snapshot may take on `device` without taking what the next steps need: free memory (on the
    device and cached by torch's allocator) less the headroom the peak so far needed above what is
    allocated now (a save runs between steps, when activations are freed) and a margin. Within a limit
    (the allocator's per-process fraction, `memory.budget_gib`), no more than the limit less that peak."""
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device)  # what is allocated now plus the steps' headroom
    room = free + torch.cuda.memory_reserved(device) - peak
    for limit in (_allocator_limit(device, total), budget_bytes):
        if limit is not None:
            room = min(room, limit - peak)
    return room - SNAPSHOT_MARGIN


def _allocator_limit(device: torch.device, total: int) -> int | None:
    """The bytes torch's allocator may hold on `device` when capped below the whole device
    (torch.cuda.set_per_process_memory_fraction); None when uncapped or this torch cannot say."""
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    value = fraction(index)  # it takes an index: a torch.device("cuda") without one is refused
    return int(value * total) if value < 1.0 else None


def _cuda_tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree] if tree.device.type == "cuda" else []
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for node in tree for t in _cuda_tensors(node)]
    return []


class Staging:
    """Host copies of a save's state, into a pool reused by every save (see the module docstring)."""

    def __init__(
        self, device: torch.device, device_copies: bool | None = None, budget_bytes: int | None = None
    ) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        """Device memory the run may use (`memory.budget_gib`); a snapshot stays inside it. None: the device's."""
        self.cuda = device.type == "cuda"
        self.device_copies = device_copies
        """Copy guarded state on the device first: None when `device_room` allows, True always, False never."""
        self.pool = HostPool(pinned=self.cuda)
        self.snapshot = (
            SnapshotBuffer(device, lambda: device_room(device, budget_bytes)) if self.cuda else None
        )
        """The device buffer kept between saves that the guarded state is copied into first."""
        self._copies_ended: torch.cuda.Event | None = (
            None  # the last save's host copies (they read the snapshot)
        )
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending: torch.cuda.Event | None = None  # the last save's guarded copies, until they ended
        self._held: list[torch.Tensor] = []  # fresh device tensors whose copies may not have ended
        self._held_storages: set[int] = set()
        self._held_bytes = 0
        self.held_limit = 0
        """Bytes of fresh device tensors held before `keep` waits for their copies (set by `begin`)."""
        self.waits = 0
        """Times this save's `keep` waited for copies (device memory ran short)."""
        self._guard = False  # this save's guarded copies read the originals: the next update waits
        self.snapshot_bytes = 0
        """Bytes of this save's state copied on the device first."""
        self.update_wait_s: list[float] = []
        """Per save (known at the next one, or at `close`): how long the first optimizer update after it waited
        on the device for its copies; 0 when none waited (a snapshot, or the copies ended first)."""
        self._unaccounted = False  # a save whose update wait is not in update_wait_s yet
        self._wait_timing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self.parts: dict[str, float] = {}
        """This save's host seconds by part: pool_wait (the reservation still running), pool_grow (slots the
        reservation lacked, pinned in the loop), snapshot_alloc, snapshot (its copies' launch, allocation
        included), host_copies (the launch of the copies to the host, pool_grow included)."""
        self.memory: dict[str, float] = {}
        """This save's device memory in GiB (CUDA): allocated and peak when it began (the peak so far: the
        steps' and earlier saves'), the snapshot, and the peak once its copies ended (set by the writer's wait)."""

    # ---------------------------------------------------------------------------------------- a save
    def begin(self) -> None:
        """A save starts: the pool is reused from its start (the previous save's write has ended)."""
        self._account()
        self.pool.rewind()
        self.parts = dict.fromkeys(
            ("pool_wait", "pool_grow", "snapshot_alloc", "snapshot", "host_copies"), 0.0
        )
        self.parts["pool_wait"] = self.pool.join_s
        self._held, self._held_storages, self._held_bytes, self.waits = [], set(), 0, 0
        self._guard, self.snapshot_bytes = False, 0
        self.memory = {}
        if self.cuda:  # gathered buckets held until copied take what a snapshot would (the next step runs)
            self.held_limit = max(1 << 30, device_room(self.device, self.budget_bytes))
            self.memory = {
                "allocated_before": torch.cuda.memory_allocated(self.device) / GiB,
                "peak_before": torch.cuda.max_memory_allocated(self.device) / GiB,
                "snapshot_held_before": self.snapshot.held / GiB,
            }

    def copy(self, tree: Any, *, guarded: bool = False, fresh_cpu: bool = False) -> Any:
        """`tree` with every tensor copied into the pool (see the module docstring for `guarded`); dicts,
        lists and tuples are rebuilt, other leaves deep-copied; CPU tensors kept as they are if `fresh_cpu`."""
        snapshot: dict[int, torch.Tensor] = {}
        originals = _cuda_tensors(tree) if guarded and self.cuda else []
        if originals:
            started = time.perf_counter()
            snapshot = self._snapshot(originals)
            self.parts["snapshot"] += time.perf_counter() - started
            self._guard = self._guard or not snapshot
            # the host copies follow the update (and the snapshot) queued on the current stream
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        started, grown = time.perf_counter(), self.pool.grow_s
        # a method, not a nested function calling itself: that closure would be a reference cycle holding the
        # snapshot's views, and the buffer with them, until Python's cyclic collector got to it
        copied = self._visit(tree, snapshot, guarded, fresh_cpu)
        snapshot.clear()
        self.parts["host_copies"] += time.perf_counter() - started
        self.parts["pool_grow"] += self.pool.grow_s - grown
        return copied

    def _visit(self, node: Any, snapshot: dict[int, torch.Tensor], guarded: bool, fresh_cpu: bool) -> Any:
        if isinstance(node, torch.Tensor):
            if node.device.type != "cpu":
                return self._to_host(snapshot.get(id(node), node), guarded)
            return node if fresh_cpu else self.pool.take(node.shape, node.dtype).copy_(node.detach())
        if isinstance(node, dict):
            return {key: self._visit(value, snapshot, guarded, fresh_cpu) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            items = [self._visit(value, snapshot, guarded, fresh_cpu) for value in node]
            return items if isinstance(node, list) else tuple(items)
        return deepcopy.deepcopy(node)

    def _snapshot(self, tensors: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Copies of `tensors` on the device, in the snapshot buffer kept between saves, on the current stream
        (id of each original -> its copy); {} when not wanted or there is no room (the buffer is freed then)."""
        _, total = layout(tensors)
        wanted = self.device_copies if self.device_copies is not None else self.snapshot.fits(total)
        buffer = self.snapshot.take(total) if wanted and not self.snapshot_bytes else None
        self.parts["snapshot_alloc"] += self.snapshot.alloc_s
        if buffer is None:
            if not wanted:
                self.snapshot.release()  # no room any more: the steps get the memory back
            return {}
        if self._copies_ended is not None:  # the last save's host copies read this buffer (ended long ago)
            torch.cuda.current_stream(self.device).wait_event(self._copies_ended)
        self.snapshot_bytes += total
        self.memory["snapshot"] = total / GiB
        self.memory["snapshot_allocated"] = self.snapshot.allocated / GiB
        return self.snapshot.fill(tensors, buffer)

    def keep(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor`, made for this save (a gathered bucket's entry): copied on the copy stream
        and held until the copy ended; past `held_limit` bytes held, the loop waits for the copies so far."""
        if tensor.device.type == "cpu":
            return self.pool.take(tensor.shape, tensor.dtype).copy_(tensor)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # it was made on the current one
        host = self._to_host(tensor, guarded=True)  # holds it
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._held_storages:
            self._held_storages.add(storage.data_ptr())
            self._held_bytes += storage.nbytes()
        if self._held_bytes > self.held_limit:
            self._stream.synchronize()
            self._held, self._held_storages, self._held_bytes = [], set(), 0
            self.waits += 1
        return host

    def _to_host(self, tensor: torch.Tensor, guarded: bool) -> torch.Tensor:
        host = self.pool.take(tensor.shape, tensor.dtype)
        if not guarded:
            return host.copy_(tensor.detach(), non_blocking=True)
        # held until the copy ended: a tensor made for this save and dropped by the caller would otherwise go
        # back to the allocator, and to the next step's kernels, while the copy stream still reads it
        self._held.append(tensor)
        with torch.cuda.stream(self._stream):
            return host.copy_(tensor.detach(), non_blocking=True)

    def finish(self) -> Callable[[], None]:
        """The copies of this save are all queued: returns the function that waits until they ended (the
        writer calls it before reading them); the optimizer's updates wait for those that read originals."""
        self._unaccounted, self._wait_timing = True, None
        if not self.cuda:
            return lambda: None
        ordered, guarded = torch.cuda.Event(), torch.cuda.Event()
        ordered.record(torch.cuda.current_stream(self.device))
        guarded.record(self._stream)
        self._pending = guarded if self._guard else None
        self._copies_ended = guarded
        held, self._held, self._held_storages, self._held_bytes = self._held, [], set(), 0
        memory, device = self.memory, self.device

        def wait() -> None:
            ordered.synchronize()
            guarded.synchronize()
            held.clear()  # gathered buckets' device memory goes back to the allocator
            memory["peak_after"] = torch.cuda.max_memory_allocated(device) / GiB

        return wait

    # ------------------------------------------------------------------------------- the optimizer
    def before_update(self, *_: Any) -> None:
        """An optimizer step pre-hook: the update's stream waits for the copies still reading what it
        changes (nothing when they ended, or on CPU)."""
        if self._pending is None:
            return
        if self._pending.query():
            self._pending = None
            return
        stream = torch.cuda.current_stream(self.device)
        if self._wait_timing is not None:  # a later update, queued behind the first one's wait
            stream.wait_event(self._pending)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        stream.wait_event(self._pending)
        end.record(stream)
        self._wait_timing = (start, end)

    def _account(self) -> None:
        """Put the last save's update wait into `update_wait_s` (its events have long passed by now)."""
        if not self._unaccounted:
            return
        waited = 0.0
        if self._wait_timing is not None:
            start, end = self._wait_timing
            end.synchronize()
            waited = start.elapsed_time(end) / 1e3
        self.update_wait_s.append(waited)
        self._unaccounted, self._wait_timing = False, None

    def close(self) -> None:
        """The run ended: free the pool (a later save allocates it again)."""
        self._account()
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
        self.pool.close()
        if self._copies_ended is not None:  # a write given up on may still be copying out of the snapshot
            self._copies_ended.synchronize()
            self._copies_ended = None
        if self.snapshot is not None:
            self.snapshot.release()


def expected_sizes(optimizer: torch.optim.Optimizer) -> list[int]:
    """Bytes of each tensor a save stages of `optimizer`, in the order it stages them, estimated before any
    state exists (the pool's reservation: chunks sized to their slots fit only in this order). Per stepped
    tensor: with DistributedAdamW its fp32 master (this rank's shard) and moments, in the order of its state
    dict (the optimizer's parameter order, not the buckets' order its param_groups follow); with torch's AdamW
    its moments only (the trainable weights are among the model's tensors); the moments two (three with
    amsgrad) in the tensor's dtype, or with 8-bit moments each as its codes and block scales (staged as they
    are); and the step count."""
    sizes = []
    masters = isinstance(optimizer, vla_overlap.DistributedAdamW)
    moments8 = getattr(optimizer, "moments", "fp32") == "int8"
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    for p in _staged_order(optimizer):
        n, size = p.numel(), p.numel() * p.element_size()
        if moments8:  # one byte per element, the scales the rest of MOMENT_BYTES
            moments = [n, -(-n * (vla_overlap.MOMENT_BYTES["int8"] - 2) // 2)] * 2
        else:
            moments = [size] * (3 if group_of[id(p)].get("amsgrad") else 2)
        sizes += ([size] if masters else []) + [int(m) for m in moments] + [4]
    return sizes


def _staged_order(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The stepped tensors in the order the optimizer's state dict holds them."""
    if isinstance(optimizer, vla_overlap.DistributedAdamW):
        return optimizer.masters_in_order
    return [p for group in optimizer.param_groups for p in group["params"]]


def expected_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of `expected_sizes`."""
    return sum(expected_sizes(optimizer))
