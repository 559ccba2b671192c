"""Faults for the multi-process failure tests, injected into the ranks of a real `gr00t-train launch` job:
every Python process started with this folder on PYTHONPATH imports this module first.

    GR00T_TEST_FAULT="1:4:raise,0:4:hang"   rank 1 raises after step 4, rank 0 hangs there (kill: SIGKILL)
    GR00T_TEST_RC_DIR=DIR                    each rank writes its exit code to DIR/rank<N>.rc, and the
                                             time a fault fires to DIR/fault<N>.time

Only the ranks (RANK is set) are touched: the launcher and the data workers it forks run unchanged."""

import os

_FAULTS = os.environ.get("GR00T_TEST_FAULT", "")
_RC_DIR = os.environ.get("GR00T_TEST_RC_DIR")

if "RANK" in os.environ and (_FAULTS or _RC_DIR):
    import signal
    import time
    from pathlib import Path

    from gr00t_train import _run_checks, cli

    _RANK = int(os.environ["RANK"])
    _MINE = {
        int(step): kind
        for rank, step, kind in (f.split(":") for f in _FAULTS.split(",") if f)
        if int(rank) == _RANK
    }
    _poll = _run_checks.RunChecks.poll

    def _faulty_poll(self, flush, data_state, samples_seen):
        step = samples_seen // (self.cfg.data.batch_size * self.cfg.optim.grad_accum * self.env.world_size)
        kind = _MINE.get(step)
        if kind and _RC_DIR:
            Path(_RC_DIR, f"fault{_RANK}.time").write_text(repr(time.time()))
        if kind == "raise":
            raise RuntimeError(f"injected fault on rank {_RANK}")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":  # as a collective that never returns (NCCL's can wait out their timeout)
            time.sleep(600)
        return _poll(self, flush, data_state, samples_seen)

    _run_checks.RunChecks.poll = _faulty_poll
    _main = cli.main

    def _recording_main(argv=None):
        code = _main(argv)
        if _RC_DIR:
            Path(_RC_DIR, f"rank{_RANK}.rc").write_text(str(code))
        return code

    cli.main = _recording_main
