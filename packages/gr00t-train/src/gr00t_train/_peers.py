"""Which rank of a multi-process run died, and why, for the survivors' one-line report.

Under torchrun the process group's TCPStore is hosted by the launcher's agent, so it outlives a dead worker.
Every rank beats a counter there once a second (a daemon thread) and, when it fails, leaves a note with its
one-line reason. A survivor whose collective failed reads the notes and watches the beats for a few
seconds: a rank with a note died of that reason; one whose beat stopped without a note was killed (kill -9,
a crash, its node went down). A survivor leaves a note too, naming what it found, so a rank that only lost
contact with that survivor names the same root cause.

The thread is also a backstop for collectives that hang instead of failing (NCCL can wait out its timeout,
ten minutes): once a peer's note says the run is over and this rank's main thread has not started its own
report within HANG_GRACE_S, the thread prints the line and ends the process."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger(__name__)

BEAT_S = 1.0
ROLL_CALL_S = 3.0
"""How long a survivor watches the others' beats before naming the silent ones (three beats)."""
HANG_GRACE_S = 10.0
STORE_TIMEOUT_S = 5.0
"""Store operations here are best effort: the store's host may be the node that went down."""
_PREFIX = "gr00t-train/peers"
_REASON_CHARS = 200
_active: PeerWatch | None = None


@dataclass(frozen=True)
class Lost:
    """A rank the run lost: its last finished step and its reason (None: it stopped answering)."""

    rank: int
    step: int | None
    reason: str | None

    def describe(self) -> str:
        after = f" after step {self.step}" if self.step is not None else ""
        if self.reason is None:
            return (
                f"rank {self.rank} stopped answering{after} (killed, or its node went down; its own output "
                "may say why)"
            )
        return f"rank {self.rank} died{after} ({self.reason})"


def one_line(err: BaseException) -> str:
    """`RuntimeError: first line of the message`, cut to a readable length."""
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


_LOST_PEER_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker",
    "broken pipe",
    "nccl",
    "gloo",
)


def looks_like_lost_peer(err: BaseException) -> bool:
    """Whether `err` (or what it was raised from) is a collective failing on another rank's absence."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, dist.DistError):
            return True
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _LOST_PEER_MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False


def peer_noted() -> bool:
    """Whether another rank of this process's running watch has left a note."""
    watch = _active
    return watch is not None and watch.peer_noted()


def store_endpoint() -> str:
    """Where the process group's store is (torchrun's MASTER_ADDR:MASTER_PORT)."""
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


class PeerWatch:
    """This rank's beat and notes in the process group's store. `start` it after the process group exists."""

    def __init__(self, store: dist.Store, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.others = [r for r in range(world_size) if r != rank]
        self.reporting = False
        """True once the main thread explains a failure itself (the hang backstop then stays out)."""
        self.on_hang: Callable[[list[Lost]], None] | None = None
        """Called from the thread when the main thread stays stuck after a peer's note (it must end the
        process)."""
        self.step: Callable[[], int | None] = lambda: None
        """This rank's last finished step (for a silent peer's `Lost.step`)."""
        self._read: tuple[int, dict[int, dict]] = (0, {})
        """The notes as of a count of them: read again only when the count moved."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gr00t-train peers", daemon=True)

    @classmethod
    def start(cls, rank: int, world_size: int) -> PeerWatch | None:
        """A running watch, or None in a single process or without a reachable store."""
        if world_size < 2 or not dist.is_initialized():
            return None
        try:
            shared = dist.distributed_c10d._get_default_store()
            clone = getattr(shared, "clone", None)
            if clone is not None:  # a connection of its own: short timeouts, no waiting behind the group
                shared = clone()
                shared.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
            watch = cls(dist.PrefixStore(_PREFIX, shared), rank, world_size)
            watch.store.add(f"beat/{rank}", 1)
        except Exception as err:  # a custom init method without a store: failures go unexplained
            log.debug("no peer watch: %s", one_line(err))
            return None
        watch._thread.start()
        global _active
        _active = watch
        return watch

    def close(self) -> None:
        """Stop beating (the run ended, one way or another)."""
        global _active
        if _active is self:
            _active = None
        self._stop.set()
        self._thread.join(timeout=2 * STORE_TIMEOUT_S)

    # ---------------------------------------------------------------------------------------- notes
    def note_death(self, err: BaseException, step: int | None) -> None:
        """This rank fails with `err`: tell the others why (best effort)."""
        self.reporting = True
        self._note({"kind": "died", "step": step, "reason": one_line(err)})

    def _note(self, note: dict) -> None:
        try:
            self.store.set(f"note/{self.rank}", json.dumps(note))
            self.store.add("notes", 1)  # after the note: whoever sees the count can read it
        except Exception as err:
            log.debug("could not leave a note in the store at %s: %s", store_endpoint(), one_line(err))

    def _notes(self) -> dict[int, dict]:
        count = self.store.add("notes", 0)
        if count != self._read[0]:
            found = {}
            for rank in self.others:
                key = f"note/{rank}"
                if self.store.check([key]):  # never `get` a missing key: it waits out the timeout
                    found[rank] = json.loads(self.store.get(key))
            self._read = (count, found)
        return self._read[1]

    def peer_noted(self) -> bool:
        """Whether another rank has left a note (a SIGTERM now is the launcher reacting to its death)."""
        try:
            return bool(self._notes())
        except Exception:
            return False

    # ---------------------------------------------------------------------------------- the report
    def lost_peers(self, wait_s: float = ROLL_CALL_S) -> list[Lost] | None:
        """The ranks that died or stopped answering, after watching their beats for up to `wait_s`; None when
        the store cannot be reached (its host may be what went down). Leaves a note of what it found."""
        self.reporting = True
        try:
            start = self._beats()
            deadline = time.monotonic() + wait_s
            while True:
                notes = self._notes()
                alive = {r for r, n in self._beats().items() if n > start[r]}
                silent = [r for r in self.others if r not in alive and r not in notes]
                # A failing rank's collectives can break before its note arrives: wait for a note.
                if (notes and not silent) or time.monotonic() >= deadline:
                    break
                time.sleep(0.3)
        except Exception as err:
            log.debug("the store at %s does not answer: %s", store_endpoint(), one_line(err))
            return None
        found = {x[0]: Lost(*x) for n in notes.values() for x in n.get("lost", [])}  # by other survivors
        lost = self._from_notes(notes) + [found.get(r, Lost(r, self.step(), None)) for r in silent]
        lost = lost or list(found.values())
        lost = sorted({x.rank: x for x in lost}.values(), key=lambda x: x.rank)
        if lost:  # else the failure is this rank's own, and its caller notes that
            self._note({"kind": "left", "lost": [[x.rank, x.step, x.reason] for x in lost]})
        return lost

    def _from_notes(self, notes: dict[int, dict]) -> list[Lost]:
        return [Lost(r, n.get("step"), n.get("reason")) for r, n in notes.items() if n.get("kind") == "died"]

    def _beats(self) -> dict[int, int]:
        return {r: self.store.add(f"beat/{r}", 0) for r in self.others}

    # ---------------------------------------------------------------------------------- the thread
    def _beat(self) -> None:
        noticed = None
        while not self._stop.wait(BEAT_S):
            try:
                self.store.add(f"beat/{self.rank}", 1)
                noted = self.on_hang is not None and not self.reporting and self.store.add("notes", 0) > 0
            except Exception:
                continue  # the store's host is gone: the collectives will fail and say so
            if not noted:
                continue
            noticed = noticed or time.monotonic()
            if time.monotonic() - noticed < HANG_GRACE_S:
                continue
            try:
                notes = self._notes()
            except Exception:
                continue
            lost = self._from_notes(notes) or [Lost(*x) for n in notes.values() for x in n.get("lost", [])]
            if lost and not self.reporting:
                log.debug("main thread still busy %.0f s after a peer's note", HANG_GRACE_S)
                self.on_hang(lost)
                return
