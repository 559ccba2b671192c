"""The whole job, not just the step: a fine-tune with checkpoints and validation, timed end to end.

One process runs `gr00t-train train` on `--dataset` with every setting at its default (n1.6-3b, batch 16) for
`--steps` steps, a checkpoint every `--every` steps and a validation every `--eval-every`, with fresh compile
caches (cold); a second process repeats only the start-up with the caches the first one filled (warm). With
`--fresh-host` the first process also writes `optimizations.compile_cache` and a third process starts on empty
caches with that file, as a job on a fresh host or container would (`startup_fresh_s`). All
read bytecode compiled beforehand (PYTHONPYCACHEPREFIX under --out, filled by compileall over sys.path), as a
user's installed packages have it from pip (`--no-bytecode` leaves it to the cold run to write). The wall time
of the job splits into start-up (process group, model, data, compilation and graph capture, to the end of the
first step), steps, checkpoint stalls (the loop waiting for a save; the writes run in the
background), validation and the rest (the final save's wait, reports). Samples/s over the whole job stand
next to the steady-state rate.

    python -m vla_io synth /tmp/libero --preset libero --episodes 20
    python benchmarks/time_to_model.py --dataset /tmp/libero --json benchmarks/results/time_to_model_h200_<date>.json

`--set model.preset=tiny --set data.num_workers=1 --steps 40 --every 10 --eval-every 10` checks it on a CPU.
Targets (one H200, n1.6-3b): stall <= 1 s per save; start-up + stalls + validation + final save <= 5% of the
job at 2,000 steps with saves every 500; warm start-up <= 20 s, cold <= 60 s; bytes per save <= 20 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gr00t_train.config.sections import LoggingConfig


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--cameras", default="image,wrist_image")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=500, help="checkpoint every this many steps")
    p.add_argument("--eval-every", type=int, default=500, help="validate every this many steps (0: never)")
    p.add_argument("--warm-steps", type=int, default=8, help="steps of the warm start-up run")
    p.add_argument("--out", type=Path, default=Path("/tmp/time_to_model"))
    p.add_argument("--json", type=Path)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--fresh-host", action="store_true",
                   help="also start a process on empty caches from the job's optimizations.compile_cache file")
    p.add_argument("--sample-warm", type=Path, metavar="TXT",
                   help="run the warm process under stack_sampler.py and write where its time went here "
                   "(and its stacks beside it, .folded.gz)")  # fmt: skip
    p.add_argument("--sample-cold", type=Path, metavar="TXT", help="the same for the first (cold) process")
    p.add_argument("--no-bytecode", action="store_true",
                   help="do not compile bytecode beforehand: the cold run compiles every module it imports")  # fmt: skip
    return p.parse_args()


def precompile_bytecode(pycache: Path) -> float:
    """Compile every module on sys.path to bytecode under `pycache`, as pip does for the packages it installs
    (the GPU host's read-only venv has no .pyc files, so its cold start-up spent ~9 s compiling sources).
    Returns the seconds it took, which are no part of the job."""
    started = time.perf_counter()
    here = Path.cwd().resolve()
    folders = sorted(
        {str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != here}
    )
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(pycache)}
    # exit status ignored: some packages ship sources for other Python versions (test data, templates)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], env=env, capture_output=True
    )
    return time.perf_counter() - started


def _train(
    args: argparse.Namespace, name: str, steps: int, caches: Path, sets: list[str], sample: Path | None = None
) -> tuple[dict, float]:
    """Run one `gr00t-train train` process (under stack_sampler.py, writing `sample`, if given); returns (its
    summary.json, its wall seconds)."""
    out = args.out / name
    sampler = [str(Path(__file__).with_name("stack_sampler.py")), "--out", str(sample),
               "--folded", str(sample.with_suffix(".folded.gz"))] if sample else []  # fmt: skip
    argv = [sys.executable, *sampler, "-m", "gr00t_train", "train", "--overwrite"]
    for item in (f"data.dataset={args.dataset}", f"data.cameras={args.cameras}", f"steps={steps}",
                 f"output_dir={out}", "logging.progress=false", *sets, *args.overrides):  # fmt: skip
        argv += ["--set", item]
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
        # bytecode of every imported module, written by the first run and read by the second, as a user's
        # installed packages have it (the GPU host's read-only venv has no .pyc files: ~9 s of compiling sources)
        "PYTHONPYCACHEPREFIX": str(caches / "pycache"),
    }
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    # the process's log (and torch's, e.g. under TORCH_LOGS) beside its run folder
    (args.out / f"{name}.stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    # the process's end after its report (plots, workers and memory released, interpreter exit), and of it
    # what the process logged before its interpreter's exit
    summary["after_summary_s"] = time.time() - (out / "summary.json").stat().st_mtime
    over = re.findall(r"run over ([0-9.]+) s after summary.json", proc.stderr)
    summary["after_summary_in_process_s"] = float(over[-1]) if over else None
    return summary, wall


def _step_rows(folder: Path) -> list[dict]:
    """metrics.jsonl's step records (validations left out)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") != "val"]


def _steps_seconds(folder: Path) -> float:
    """Seconds of every step but the first (which start-up counts), from metrics.jsonl."""
    steps = _step_rows(folder)
    return sum(float(r["step_time_s"]) for r in steps[1:])


def idle_between_steps(folder: Path, every: int, writes_s: list[float], flush_every: int) -> dict:
    """The seconds between steps (metrics.jsonl's between_steps_s: on CUDA the device idle) by where they
    fall: the first step after a save or validation (the stall, the validation), the first after a log flush
    (`logging.every`: the host syncs with the device), the steps while a background write ran (for its write_s
    of the steps' time), and the rest; with the mean per step of the last three."""
    seconds = dict.fromkeys(("after_save_or_validation", "after_log_flush", "during_writes", "elsewhere"), 0.0)
    counts = dict.fromkeys(seconds, 0)
    writes, write_left = iter(writes_s), 0.0
    for row in _step_rows(folder):
        between, done = float(row.get("between_steps_s", 0.0)), row["step"] - 1
        if every and done > 0 and done % every == 0:
            where, write_left = "after_save_or_validation", next(writes, 0.0)
        elif flush_every and done > 0 and done % flush_every == 0:
            where = "after_log_flush"
        elif write_left > 0:
            where = "during_writes"
        else:
            where = "elsewhere"
        if where != "after_save_or_validation" and write_left > 0:
            write_left -= float(row["step_time_s"]) + between
        seconds[where] += between
        counts[where] += 1
    out: dict = {k: round(v, 3) for k, v in seconds.items()}
    for where in ("after_log_flush", "during_writes", "elsewhere"):
        out[f"{where}_steps"] = counts[where]
        out[f"{where}_ms_per_step"] = round(1000 * seconds[where] / max(1, counts[where]), 3)
    return out


def split_other(
    other: float, summary: dict, steps_s: float, stalls: list[float], validation_s: float, step1_late: float = 0.0
) -> dict:
    """The job's rest (`other_s`) by part, from summary.json's `session_parts_s` (gr00t_train's Trainer); of
    the loop's time between steps, `step1_late` (`step1_end_late`) apart."""
    session = summary.get("session_parts_s") or {}
    final = sum((summary.get("checkpoint_final_wait_s") or {}).values())
    after_first = session.get("after_first_step", 0.0)
    parts = {
        "after_first_step": after_first,
        "of_it_compile_cache_write": session.get("compile_cache_write", 0.0),
    }
    if "loop_after_first_step" in session:
        inside = after_first + steps_s + sum(stalls) + validation_s + final
        between = max(0.0, session["loop_after_first_step"] - inside)
        parts["before_step_2"] = min(step1_late, between)
        parts["between_steps"] = between - parts["before_step_2"]
    parts["final_save_wait"] = final
    parts["end"] = sum(v for k, v in session.items() if k.startswith("end_"))
    parts["after_summary"] = float(summary.get("after_summary_s") or 0.0)
    counted = sum(v for k, v in parts.items() if not k.startswith("of_it"))
    parts["unattributed"] = other - counted
    return {k: round(v, 3) for k, v in parts.items()}


def step1_end_late(folder: Path, summary: dict) -> float:
    """How much later step 1's end event was recorded than the step ended: its event time less the host's
    first step (`first_step_s`), the wait for its batch before it and the host work after it
    (`after_first_step`: the compile cache file, the checkpoint pool's reservation started). What is left is
    the loop's first launch after step 1 waiting (for the CUDA driver, which the pool's pinning holds)."""
    first = next((r for r in _step_rows(folder) if r["step"] == 1), None)
    host = summary.get("first_step_s")
    if first is None or host is None:
        return 0.0
    after = (summary.get("session_parts_s") or {}).get("after_first_step", 0.0)
    return max(0.0, float(first["step_time_s"]) - host - float(first.get("data_wait_s", 0.0)) - after)


def describe_parts(parts: dict) -> str:
    """'settle 0.000 s, ... (staging: pool_wait 0.000 s, ...)', as the training log writes it."""
    laps = ", ".join(f"{k} {v:.3f} s" for k, v in parts.items() if not isinstance(v, dict))
    inner = parts.get("staging") or {}
    return laps + (
        " (staging: " + ", ".join(f"{k} {v:.3f} s" for k, v in inner.items()) + ")" if inner else ""
    )


def project_share(
    result: dict, args: argparse.Namespace, long_steps: int = 20_000, long_every: int = 2_000
) -> dict:
    """The non-step share of a longer job from this one's parts: the libero preset's 20,000 steps with a save
    (and a validation) every 2,000, at this job's cold start-up, mean step, mean stall and mean validation,
    and this job's rest (the final save's wait). At 2,000 steps of ~60 ms, 5% is 6 s: less than any start-up,
    so the share is also given where start-up has paid off."""
    step = result["steps_s"] / max(1, args.steps - 1)
    stalls = result["checkpoint_stall_s"] or [0.0]
    validation = result["validation_s"] / max(1, args.steps // args.eval_every) if args.eval_every else 0.0
    saves = long_steps // long_every
    overhead = result["startup_s"] + saves * (sum(stalls) / len(stalls) + validation) + result["other_s"]
    return {"steps": long_steps, "every": long_every, "share": overhead / (overhead + long_steps * step)}


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    caches = Path(tempfile.mkdtemp(prefix="compile-caches-", dir=args.out))  # empty: the first run is cold
    # a save of n1.6-3b is 22 GB: two of them fit the GPU hosts' 64 GB scratch disk beside the dataset and
    # caches. keep_last=2 holds two at most (a save removes the one it pushes out beside its write), as
    # keep_last=1 does (the old one stays until the new one is in place)
    job = [f"checkpoint.every={args.every}", f"eval.every={args.eval_every}", "checkpoint.keep_last=2"]
    bytecode_s = None if args.no_bytecode else precompile_bytecode(caches / "pycache")
    compile_cache = args.out / "compile_cache.bin"
    compile_cache.unlink(missing_ok=True)
    if args.fresh_host:
        job.append(f"optimizations.compile_cache={compile_cache}")
    summary, wall = _train(args, "job", args.steps, caches, job, args.sample_cold)
    # the job's saves leave gigabytes of dirty pages that the kernel writes back after it exits: the warm
    # start-up would read its caches and bytecode behind that write-back, so it is flushed first
    flushed = time.perf_counter()
    os.sync()
    flush_s = time.perf_counter() - flushed
    # the job's checkpoint settings (so the warm start reserves the same staging memory), with no save in its
    # few steps and no final one
    warm_sets = [f"checkpoint.every={args.every}", "checkpoint.keep_last=1", "checkpoint.save_final=false",
                 "eval.every=0"]  # fmt: skip
    warm, _ = _train(args, "warm", args.warm_steps, caches, warm_sets, args.sample_warm)
    fresh = {}
    if args.fresh_host:  # empty Inductor and Triton caches, the same installed bytecode, the job's file
        fresh_caches = Path(tempfile.mkdtemp(prefix="fresh-caches-", dir=args.out))
        (fresh_caches / "pycache").symlink_to(caches / "pycache")
        sets = [*warm_sets, f"optimizations.compile_cache={compile_cache}"]
        fresh, _ = _train(args, "fresh", args.warm_steps, fresh_caches, sets)
    steps_s = _steps_seconds(args.out / "job")
    stalls = list(summary.get("checkpoint_stall_s") or [])
    validation_s = float(summary.get("validation_s") or 0.0)
    startup = float(summary["startup_s"])
    other = max(0.0, wall - startup - steps_s - sum(stalls) - validation_s)
    samples = args.steps * int(summary["global_batch"])
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "settings": {
            "dataset": str(args.dataset),
            "steps": args.steps,
            "checkpoint_every": args.every,
            "eval_every": args.eval_every,
            "overrides": args.overrides,
            "bytecode_compiled_beforehand": not args.no_bytecode,
        },  # fmt: skip
        "bytecode_precompile_s": bytecode_s,
        "wall_s": wall,
        "startup_s": startup,
        "startup_warm_s": float(warm["startup_s"]),
        "flush_before_warm_s": flush_s,
        # --fresh-host: start-up on empty caches with the job's compile cache file, and what the file did
        "startup_fresh_s": float(fresh["startup_s"]) if fresh else None,
        "startup_phases_fresh": fresh.get("startup_phases"),
        "startup_compile_caches_fresh": fresh.get("startup_compile_caches"),
        "compile_cache": {"job": summary.get("compile_cache"), "fresh": fresh.get("compile_cache")},
        # where each start-up went (seconds per phase: imports, process group, model, data, optimizer,
        # compile, graph capture, first step), cold and warm
        "startup_phases": summary.get("startup_phases"),
        "startup_phases_warm": warm.get("startup_phases"),
        # the model phase by part (run folder, dataset metadata, imports, ..., weights, frozen prefix)
        "startup_model_parts": summary.get("startup_model_parts"),
        "startup_model_parts_warm": warm.get("startup_model_parts"),
        # torch.compile's FX graph and AOTAutograd caches: hits, misses and bypasses (warm: all hits)
        "startup_compile_caches": summary.get("startup_compile_caches"),
        "startup_compile_caches_warm": warm.get("startup_compile_caches"),
        # torch.compile's own timers (tracing, AOTAutograd, Inductor's lowering, the wait for its kernel
        # compiles; nested, so they overlap), cold and warm
        "startup_compile_parts": summary.get("startup_compile_parts"),
        "startup_compile_parts_warm": warm.get("startup_compile_parts"),
        "steps_s": steps_s,
        "checkpoint_stall_s": stalls,
        # each stall by part (they add up to it), the staging's own parts beside them (pool wait and growth,
        # snapshot allocation and copies, host copies), and the device memory around each save
        "checkpoint_stall_parts_s": summary.get("checkpoint_stall_parts_s"),
        "checkpoint_memory_gib": summary.get("checkpoint_memory_gib"),
        # inside steps_s: how long the first update after each save waited on the GPU for its host copies
        "checkpoint_update_wait_s": summary.get("checkpoint_update_wait_s"),
        "checkpoint_write_s": summary.get("checkpoint_write_s"),
        # each background write by part (the wait for the copies, torch.save of the optimizer state, the
        # model, the manifest's hashing, the fsync, ...): what bounds a write, the CPU or the disk
        "checkpoint_write_parts_s": summary.get("checkpoint_write_parts_s"),
        "checkpoint_bytes": summary.get("checkpoint_bytes"),
        "validation_s": validation_s,
        # inside other_s: the final save's wait (the write, then the staging pool's release), and the
        # process's end after summary.json was written
        "checkpoint_final_wait_s": summary.get("checkpoint_final_wait_s"),
        "after_summary_s": summary["after_summary_s"],
        # of it: before the interpreter's exit (the rest is the exit: atexit handlers, CUDA's teardown)
        "after_summary_in_process_s": summary["after_summary_in_process_s"],
        "other_s": other,
        # other_s by part: the host work after the first step (of it the compile cache's write), the loop's
        # first launch after it waiting (`step1_end_late`), the GPU idling between later steps while the host
        # works (step times are CUDA events), the final save's wait, the end (model release, pipeline
        # shutdown), the process after summary.json; the rest is unattributed
        "other_parts_s": split_other(
            other, summary, steps_s, stalls, validation_s, step1_end_late(args.out / "job", summary)
        ),
        # the seconds between steps, step by step (metrics.jsonl): after saves and validations, while the
        # background writes ran, elsewhere
        "between_steps_s": idle_between_steps(
            args.out / "job", args.every, summary.get("checkpoint_write_s") or [], LoggingConfig().every
        ),
        # the log flushes' host seconds by part, summed over the job (what the device idles after a flush)
        "flush_host_s": {
            k: round(v, 3) for k, v in (summary.get("session_parts_s") or {}).items() if k.startswith("flush_")
        },
        "non_step_share": (wall - steps_s) / wall,
        "samples_per_s_job": samples / wall,
        "samples_per_s_steady": summary["samples_per_s"],
        "peak_memory_gib": summary.get("peak_memory_gib"),
        # the steps' peak apart from the saves': the peak before the first save began
        "peak_memory_before_saves_gib": summary.get("peak_memory_before_saves_gib"),
    }
    result["projected_non_step_share"] = project_share(result, args)
    print(json.dumps(result, indent=2))
    for name, phases in (
        ("cold", result["startup_phases"]),
        ("warm", result["startup_phases_warm"]),
        ("fresh host, compile cache file", result["startup_phases_fresh"]),
    ):
        if phases:
            print(f"start-up {name}: " + ", ".join(f"{key} {value:.1f} s" for key, value in phases.items()))
    for name, caches in (
        ("cold", result["startup_compile_caches"]),
        ("warm", result["startup_compile_caches_warm"]),
        ("fresh host, compile cache file", result["startup_compile_caches_fresh"]),
    ):
        if caches:
            print(f"compile caches {name}: " + ", ".join(f"{key} {value}" for key, value in caches.items()))
    for name, timers in (
        ("cold", result["startup_compile_parts"]),
        ("warm", result["startup_compile_parts_warm"]),
    ):
        if timers:
            top = list(timers.items())[:12]
            print(f"compile timers {name}: " + ", ".join(f"{key} {value:.1f} s" for key, value in top))
    for name, parts in (
        ("cold", result["startup_model_parts"]),
        ("warm", result["startup_model_parts_warm"]),
    ):
        if parts:
            print(f"model phase {name}: " + ", ".join(f"{key} {value:.2f} s" for key, value in parts.items()))
    print(
        f"\njob {wall:.1f} s: start-up {startup:.1f} s (warm {result['startup_warm_s']:.1f} s), steps {steps_s:.1f} s, "
        f"{len(stalls)} saves stalling {sum(stalls):.2f} s (max {max(stalls, default=0):.2f} s; the next "
        f"updates waited {sum(result['checkpoint_update_wait_s'] or []):.2f} s more), validation "
        f"{validation_s:.1f} s, rest {other:.1f} s; non-step share {100 * result['non_step_share']:.1f}%; "
        f"{result['samples_per_s_job']:.1f} samples/s over the job against {result['samples_per_s_steady']:.1f} steady"
    )
    final = result["checkpoint_final_wait_s"] or {}
    print(
        "rest: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["other_parts_s"].items())
        + "; the final save's wait " + ", ".join(f"{k} {v:.1f} s" for k, v in final.items())
        + f"; after summary.json in the process {result['after_summary_in_process_s'] or 0:.1f} s, then its exit"
    )  # fmt: skip
    print("between steps: " + ", ".join(f"{k} {v}" for k, v in result["between_steps_s"].items()))
    print("log flushes, host: " + ", ".join(f"{k} {v} s" for k, v in result["flush_host_s"].items()))
    if fresh:
        print(f"start-up on a fresh host with the compile cache file: {result['startup_fresh_s']:.1f} s "
              f"({result['compile_cache']})")  # fmt: skip
    long = result["projected_non_step_share"]
    print(
        f"projected non-step share at {long['steps']} steps, a save every {long['every']}: {100 * long['share']:.1f}%"
    )
    for index, parts in enumerate(result["checkpoint_stall_parts_s"] or []):
        print(f"save {index + 1}: stall {stalls[index]:.3f} s = " + describe_parts(parts))
    for index, parts in enumerate(result["checkpoint_write_parts_s"] or []):
        print(f"save {index + 1}: write {result['checkpoint_write_s'][index]:.2f} s = " + describe_parts(parts))
    for index, memory in enumerate(result["checkpoint_memory_gib"] or []):
        print(f"save {index + 1}: memory (GiB) " + ", ".join(f"{k} {v:.2f}" for k, v in memory.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
