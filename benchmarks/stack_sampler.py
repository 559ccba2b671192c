"""Where a Python process's wall time goes: the main thread's stack sampled every few milliseconds.

    python benchmarks/stack_sampler.py --out samples.txt -m gr00t_train train --set ...

Runs the module like `python -m`, with a daemon thread reading the main thread's stack
(`sys._current_frames`) every `--interval` seconds until the module returns. cProfile counts calls and slows
Python-heavy work (Dynamo's tracing) several times over; a sampler costs one stack walk per interval and also
sees time spent in C (CUDA context creation, a cuBLAS handle, a file read) under the Python frame that called
it. The report lists functions by inclusive share (the samples whose stack holds them) and by self share
(the innermost frame), each as `seconds  share  file:line function`; `--folded` also writes every sampled
stack, outermost first, as gzipped `frame;frame;...;frame count` lines (the flame-graph tools' input), for
finding who called what. Only the main thread is read, and its frame is let go at once: holding another
thread's frames keeps their locals alive, so autograd's engine thread copied a gradient it would have taken
and the CUDA graph check stopped a sampled run (H200, 2026-12-04)."""

from __future__ import annotations

import argparse
import collections
import gzip
import runpy
import sys
import threading
import time
from pathlib import Path


class StackSampler:
    """Samples one thread's stack every `interval` seconds on a daemon thread, until `stop()`."""

    def __init__(self, thread_id: int, interval: float) -> None:
        self.thread_id, self.interval = thread_id, interval
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.innermost: collections.Counter[str] = collections.Counter()
        self.stacks: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> StackSampler:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> float:
        """Stops sampling; returns the seconds sampled."""
        self._done.set()
        self._thread.join()
        return time.perf_counter() - self.started

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            self.samples += 1
            stack = []
            while frame is not None:
                stack.append(_where(frame))
                frame = frame.f_back
            self.stacks[tuple(reversed(stack))] += 1
            self.innermost[stack[0]] += 1
            for key in set(stack):  # a recursive function counts once per sample
                self.inclusive[key] += 1

    def report(self, seconds: float, top: int) -> str:
        per_sample = seconds / max(1, self.samples)
        lines = [f"{self.samples} samples over {seconds:.1f} s ({1000 * per_sample:.1f} ms each)"]
        for title, counts in (("inclusive", self.inclusive), ("self", self.innermost)):
            lines.append(f"\n# {title}: seconds, share, where")
            for key, count in counts.most_common(top):
                lines.append(f"{count * per_sample:8.2f} {count / max(1, self.samples):6.1%}  {key}")
        return "\n".join(lines) + "\n"

    def write_folded(self, path: Path) -> None:
        with gzip.open(path, "wt") as f:
            for stack, count in self.stacks.most_common():
                f.write(";".join(stack) + f" {count}\n")


def _where(frame) -> str:
    code = frame.f_code
    where = code.co_filename.rsplit("site-packages/", 1)[-1].rsplit("/src/", 1)[-1]  # short: package/module
    return f"{where}:{code.co_firstlineno} {code.co_name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the report (text)")
    p.add_argument("--interval", type=float, default=0.005, help="seconds between samples")
    p.add_argument("--top", type=int, default=80, help="functions listed per table")
    p.add_argument("--folded", type=Path, help="also every sampled stack here (gzipped folded lines)")
    p.add_argument("-m", dest="module", required=True, help="the module to run, as python -m runs it")
    args, rest = p.parse_known_args()
    sys.argv = [args.module, *rest]
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # as `python -m` runs it: this folder's scripts are not importable modules
    sampler = StackSampler(threading.main_thread().ident, args.interval).start()
    code = 0
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        seconds = sampler.stop()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(sampler.report(seconds, args.top))
        if args.folded:
            sampler.write_folded(args.folded)
    sys.exit(code)


if __name__ == "__main__":
    main()
