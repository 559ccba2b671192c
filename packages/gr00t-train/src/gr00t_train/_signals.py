"""SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) become a request to stop after the current step with
a checkpoint, instead of killing the run mid-step. A second SIGINT stops at once (KeyboardInterrupt). Several
ranks stop together at a step they all reach (`_run_checks.RunChecks.poll`): a checkpoint is written there
only if every rank gets there."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_loop_began = False
_start_up_interrupted = False
_late_sigterm = False


def watch_start_up() -> Any:
    """Until a loop takes over: Ctrl-C raises KeyboardInterrupt as usual, and is also remembered. Python
    drops an exception raised inside some callbacks (an import lock's, a weakref's), which would leave a
    start-up Ctrl-C unanswered; the loop's `install()` answers it then. SIGTERM keeps its effect until a loop
    has run; after one, the first SIGTERM waits while the run says how it ended (a launcher stops every
    rank once one died, and the survivors' report must get out). Returns the handlers it replaced (None off
    the main thread, where signals cannot be caught)."""
    global _loop_began, _late_sigterm
    if threading.current_thread() is not threading.main_thread():
        return None
    _loop_began = _late_sigterm = False

    def interrupted(signum: int, frame: Any) -> None:
        global _start_up_interrupted
        _start_up_interrupted = True
        raise KeyboardInterrupt

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, interrupted)}
    before = signal.getsignal(signal.SIGTERM)

    def terminated(signum: int, frame: Any) -> None:
        global _late_sigterm
        if _loop_began and not _late_sigterm:
            _late_sigterm = True
            return
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:  # the default: end the process by the signal, as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, terminated)
    previous[signal.SIGTERM] = before
    return previous


def stop_watching(previous: Any) -> None:
    """Give SIGINT and SIGTERM back to the handlers `watch_start_up` replaced, and forget a remembered
    Ctrl-C."""
    global _start_up_interrupted, _late_sigterm
    _start_up_interrupted = _late_sigterm = False
    for sig, handler in (previous or {}).items():
        if handler is not None:  # None: installed outside Python, cannot be put back from here
            signal.signal(sig, handler)


def loop_began() -> bool:
    """Whether a training loop of this process has taken over SIGINT (the command line's Ctrl-C message)."""
    return _loop_began


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C during training: the run stops mid-step, without a checkpoint of that step."""


class StopRequest:
    """Installed for the duration of a training loop (main thread only; elsewhere signals stay as they are)."""

    def __init__(self, world_size: int = 1, peer_noted: Callable[[], bool] | None = None) -> None:
        self.signum: int | None = None
        self.world_size = world_size
        self.peer_noted = peer_noted
        """Whether another rank left a death note (then a SIGTERM is the launcher stopping the survivors)."""
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        """The received signal's name (SIGTERM, SIGINT)."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def install(self) -> StopRequest:
        """Catch SIGTERM and SIGINT from now on (a start-up Ctrl-C that went unanswered stops the run now)."""
        global _loop_began
        if _start_up_interrupted:
            raise KeyboardInterrupt
        _loop_began = True
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Give the signals back to whoever had them."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            self.restore()
            raise StoppedAtOnce  # asked twice: stop now, without a checkpoint
        if self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            if self.world_size == 1:
                log.warning(
                    "%s received: stopping after this step with a checkpoint (Ctrl-C again to stop at once)",
                    name,
                )
            elif not (self.peer_noted is not None and self.peer_noted()):  # else the peer's report follows
                log.warning(
                    "%s received: the %d ranks stop together at the next logging step (logging.every), with a "
                    "checkpoint if every rank gets there (Ctrl-C again to stop at once)",
                    name,
                    self.world_size,
                )
