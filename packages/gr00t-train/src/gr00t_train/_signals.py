"""SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C) become a request to stop after the current step with
a checkpoint, instead of killing the run mid-step. A second SIGINT stops at once (KeyboardInterrupt)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_loop_began = False
_start_up_interrupted = False


def watch_start_up() -> Any:
    """Until a loop takes over: Ctrl-C raises KeyboardInterrupt as usual, and is also remembered. Python
    drops an exception raised inside some callbacks (an import lock's, a weakref's), which would leave a
    start-up Ctrl-C unanswered; the loop's `install()` answers it then. Returns the handler it replaced
    (None off the main thread, where signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupted(signum: int, frame: Any) -> None:
        global _start_up_interrupted
        _start_up_interrupted = True
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, interrupted)


def stop_watching(previous: Any) -> None:
    """Give SIGINT back to the handler `watch_start_up` replaced, and forget a remembered Ctrl-C."""
    global _start_up_interrupted
    _start_up_interrupted = False
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def loop_began() -> bool:
    """Whether a training loop of this process has taken over SIGINT (the command line's Ctrl-C message)."""
    return _loop_began


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C during training: the run stops mid-step, without a checkpoint of that step."""


class StopRequest:
    """Installed for the duration of a training loop (main thread only; elsewhere signals stay as they are)."""

    def __init__(self) -> None:
        self.signum: int | None = None
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
            log.warning(
                "%s received: stopping after this step with a checkpoint (Ctrl-C again to stop at once)",
                signal.Signals(signum).name,
            )
