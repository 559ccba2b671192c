"""Time one eager training step (forward + backward) of GR00T N1.6 and report samples/s and MFU.

Default: n1.6-3b with random weights, batch 16, two 256x256 cameras (resized to 252x252, 81 tokens each), on
the GPU. MFU = analytic training FLOPs per sample (gr00t_model.training_flops_per_sample, no LM head) x
samples/s / peak (the datasheet dense bf16 peak: 989 TFLOP/s for an H100/H200).

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/model_step.py --json benchmarks/results/model_step_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch, training_flops_per_sample
from gr00t_model._config import PRESETS


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="n1.6-3b", choices=PRESETS)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--cameras", type=int, default=2)
    p.add_argument(
        "--image-size", type=int, default=256, help="source side in pixels, rounded to a multiple of 28"
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--optimizer", action="store_true", help="also time a fused AdamW step")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 peak (H200: 989)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    return p.parse_args()


def main() -> None:
    args = parse()
    device = torch.device(args.device)
    unit = 28
    side = max(unit, round(args.image_size / unit) * unit)
    config = GR00TConfig.preset(args.preset, image_size=(side, side))
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        model = GR00TN16(config).train()
    build_s = time.perf_counter() - started
    step_model = torch.compile(model) if args.compile else model
    batch = make_dummy_batch(config, args.batch, num_images=args.cameras, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda") if args.optimizer else None

    def step() -> torch.Tensor:
        loss = step_model(batch)["loss"]
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        for p in params:
            p.grad = None
        return loss

    for _ in range(args.warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    flops = training_flops_per_sample(config, num_images=args.cameras, image_size=(side, side))
    step_s = statistics.mean(times)
    samples_s = args.batch / step_s
    tokens = flops["vlm_tokens"] + flops["dit_tokens"]
    result = {
        "benchmark": "model_step",
        "preset": args.preset,
        "batch": args.batch,
        "cameras": args.cameras,
        "image_size": [side, side],
        "vlm_tokens": int(flops["vlm_tokens"]),
        "dit_tokens": int(flops["dit_tokens"]),
        "optimizer": args.optimizer,
        "compile": args.compile,
        "steps": args.steps,
        "build_s": round(build_s, 2),
        "step_ms_mean": round(step_s * 1e3, 2),
        "step_ms_median": round(statistics.median(times) * 1e3, 2),
        "step_ms_min": round(min(times) * 1e3, 2),
        "samples_per_s": round(samples_s, 2),
        "tokens_per_s": round(samples_s * tokens, 1),
        "train_gflop_per_sample": round(flops["train"] / 1e9, 1),
        "achieved_tflops": round(flops["train"] * samples_s / 1e12, 2),
        "mfu": round(flops["train"] * samples_s / (args.peak_tflops * 1e12), 4),
        "peak_tflops": args.peak_tflops,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.type == "cuda"
        else None,
        "final_loss": round(loss.item(), 4),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
