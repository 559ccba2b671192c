"""Does a second process reuse torch.compile's caches for the model's compiled blocks?

    PYTHONPATH=<the packages' src folders> python benchmarks/probes/compile_cache_probe.py \
        [--preset tiny|n1.6-3b] [--device cpu|cuda] [--batch 2] [--cache-dir DIR] [--json OUT] [--options JSON]

Runs the same child twice, one process after the other, with one TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR
(a fresh temporary folder unless --cache-dir is given). Each child builds the model from random weights,
compiles its repeated blocks with `GR00TN16.compile_blocks` (the trainer's options; --options adds Inductor
options as JSON, e.g. '{"use_static_cuda_launcher": false}'), runs one forward and backward, and reports
Inductor's FX graph cache and AOTAutograd cache counters (hit / miss / bypass), the static Triton autotuners
loaded from the cache, and the seconds of that first step. The second process should hit: misses 0, bypasses 0.
Prints one line per process and the verdict (exit 1 when the second process misses); --json writes both
reports. With --artifacts the second process starts on empty caches of its own, as on a fresh host, with the
file of torch.compile cache artifacts the first one wrote (`optimizations.compile_cache`, gr00t-train's
`CompileCache`). Measured on a CPU (tiny, 2026-12-03): the first process 17 FX graph misses and 12 AOTAutograd misses,
the second 17 and 12 hits and its first step 8.7 s instead of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> dict:
    """One process: build, compile, one forward and backward; the cache counters and seconds."""
    import torch
    from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
    from gr00t_train.metrics.startup import compile_cache_counts
    from torch._dynamo.utils import counters

    reasons: dict[str, int] = {}
    _count_bypass_reasons(reasons)
    device = torch.device(args.device)
    config = GR00TConfig.preset(args.preset)
    torch.manual_seed(0)
    model = GR00TN16(config).to(device).train()
    options = json.loads(args.options) if args.options else {}
    artifacts = None
    if args.artifacts_file:
        from gr00t_train.model.compile_cache import CompileCache

        artifacts = CompileCache.open(args.artifacts_file)
    model.compile_blocks(**({"options": options} if options else {}))
    batch = make_dummy_batch(config, args.batch, num_images=1, device=device)
    start = time.perf_counter()
    loss = model(batch)["loss"]
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    report = {**dict.fromkeys(("fx_graph_hit", "aot_autograd_hit"), 0), **compile_cache_counts()}
    if artifacts is not None:
        artifacts.save()
        report |= {
            "artifacts_loaded_bytes": artifacts.loaded_bytes,
            "artifacts_saved_bytes": artifacts.saved_bytes,
        }
    report["static_autotuners_loaded"] = int(counters["inductor"]["triton_bundler_load_static_autotuner"])
    return {**report, "first_step_s": round(seconds, 2), "loss": float(loss), "bypass_reasons": reasons}


def _count_bypass_reasons(reasons: dict[str, int]) -> None:
    """Count the reasons torch logs (at INFO) when a graph bypasses the FX graph or AOTAutograd cache."""
    import logging

    class Bypasses(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "Bypassing" in message:
                reasons[message[:200]] = reasons.get(message[:200], 0) + 1

    for name in ("torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(Bypasses())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--options", default="", help="extra Inductor options as JSON")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--artifacts", action="store_true",
                        help="the second process on empty caches of its own, with the first's artifact file")  # fmt: skip
    parser.add_argument("--artifacts-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory(prefix="compile_cache_probe_") as tmp:
        cache = args.cache_dir or Path(tmp)
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
        }
        command = [sys.executable, __file__, "--child", "--preset", args.preset, "--device", args.device]
        command += ["--batch", str(args.batch), "--options", args.options]
        if args.artifacts:
            command += ["--artifacts-file", str(cache / "compile_cache.bin")]
        reports = []
        for name in ("first", "second"):
            if args.artifacts and name == "second":  # a fresh host: nothing but the file
                env |= {"TORCHINDUCTOR_CACHE_DIR": str(cache / "fresh" / "inductor"),
                        "TRITON_CACHE_DIR": str(cache / "fresh" / "triton")}  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"the {name} process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{name:6s} process: {reports[-1]}")
    second = reports[1]
    hits = second.get("fx_graph_miss", 0) == 0 and second.get("fx_graph_bypass", 0) == 0
    hits = hits and second["fx_graph_hit"] > 0
    hits = hits and second.get("aot_autograd_miss", 0) == 0 and second.get("aot_autograd_bypass", 0) == 0
    print("second process hits the FX graph and AOTAutograd caches:", "yes" if hits else "NO")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "runs": reports}, indent=1, default=str))
    if not hits:
        sys.exit(1)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
