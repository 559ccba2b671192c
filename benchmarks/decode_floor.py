"""What one random frame costs to decode, part by part: the floor under any loader that samples uniformly.

For each video file of a dataset's first camera (one thread, CPU time):
- `open`: creating a torchcodec decoder (approximate mode, as loader (b) does for every frame);
- `keyframe` / `other frame`: decoding one packet straight from the file with dav1d/FFmpeg through PyAV, by
  frame type (the packets are read once beforehand, so demuxing is not counted);
- `random frame, raw`: flush + decode from the previous keyframe to a random frame, no color conversion;
- `random frame, torchcodec long-lived`: `get_frames_at([i])` on an open decoder (what vla-io's workers do);
- `random frame, torchcodec new decoder`: a new decoder per frame (loader (b) of io_throughput.py).

With a keyframe every 2 frames (LeRobot's default) a random frame needs its keyframe decoded, so no loader
that samples frames uniformly at random can go below `random frame, raw`; the ratio of the last two rows
bounds what keeping decoders open can gain over opening one per frame.

    python benchmarks/decode_floor.py --json benchmarks/results/decode_floor_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="/tmp/vla_io_bench/libero-v2.1-av1-256px-20x200")
    p.add_argument("--frames", type=int, default=400, help="random frames per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def cpu_ms(fn, n: int) -> float:
    """CPU milliseconds per call of fn(i) for i in range(n)."""
    start = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - start) / n * 1e3


def read_packets(path: str):
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        packets = [(bytes(p), p.is_keyframe) for p in container.demux(stream) if p.size]
        return packets, stream.codec_context.name, stream.codec_context.extradata


def main(argv=None) -> dict:
    import av
    from torchcodec.decoders import VideoDecoder
    from vla_io import LeRobotDataset

    args = parse_args(argv)
    torch.set_num_threads(1)
    ds = LeRobotDataset(args.dataset, progress=False)
    key = ds.video_keys[0]
    paths = sorted({str(ep.videos[key].path) for ep in ds._episodes})
    files = {p: read_packets(p) for p in paths}
    codec, extradata = next(iter(files.values()))[1:]
    ctx = av.CodecContext.create(codec, "r")
    ctx.extradata, ctx.thread_count = extradata, 1
    ctx.open()
    rng = np.random.default_rng(args.seed)
    picks = [(p, int(rng.integers(len(files[p][0])))) for p in rng.choice(paths, args.frames)]
    keys = [(p, i) for p, pk in files.items() for i, (_, k) in enumerate(pk[0]) if k]
    others = [(p, i) for p, pk in files.items() for i, (_, k) in enumerate(pk[0]) if not k]

    def decode_one(pair):  # one packet after its predecessor (decoder state is right for it)
        path, i = pair
        packets = files[path][0]
        if i > 0 and not packets[i][1]:
            ctx.decode(av.Packet(packets[i - 1][0]))
        start = time.process_time()
        ctx.decode(av.Packet(packets[i][0]))
        return time.process_time() - start

    def random_raw(pair):
        path, i = pair
        packets = files[path][0]
        start = max(j for j in range(i + 1) if packets[j][1])
        ctx.flush_buffers()
        for j in range(start, i + 1):
            ctx.decode(av.Packet(packets[j][0]))

    decoders = {p: VideoDecoder(p, seek_mode="exact", num_ffmpeg_threads=1) for p in paths}
    sample_keys = [keys[k] for k in rng.integers(len(keys), size=args.frames)]
    sample_others = [others[k] for k in rng.integers(len(others), size=args.frames)] if others else []
    rows = {
        "open (approximate)": cpu_ms(
            lambda i: VideoDecoder(picks[i][0], seek_mode="approximate"), args.frames
        ),
        "keyframe": 1e3 * float(np.mean([decode_one(x) for x in sample_keys])),
        "other frame": 1e3 * float(np.mean([decode_one(x) for x in sample_others])) if others else None,
        "random frame, raw": cpu_ms(lambda i: random_raw(picks[i]), args.frames),
        "random frame, torchcodec long-lived": cpu_ms(
            lambda i: decoders[picks[i][0]].get_frames_at(indices=[picks[i][1]]), args.frames
        ),
        "random frame, torchcodec new decoder": cpu_ms(
            lambda i: VideoDecoder(picks[i][0], seek_mode="approximate").get_frames_at(indices=[picks[i][1]]),
            args.frames,
        ),
    }
    key_share = len(keys) / (len(keys) + len(others))
    print(
        f"{args.dataset}: {len(paths)} files of {key!r}, codec {codec}, keyframes {100 * key_share:.0f}% of frames"
    )
    for name, value in rows.items():
        print(f"{name:<40}{'-' if value is None else f'{value:.3f}':>8} CPU ms")
    ratio = rows["random frame, torchcodec new decoder"] / rows["random frame, torchcodec long-lived"]
    print(f"new decoder per frame / long-lived: {ratio:.2f}x (the most open decoders can gain on decoding)")
    result = {
        "benchmark": "decode_floor",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "dataset": args.dataset,
        "codec": codec,
        "keyframe_share": key_share,
        "frames": args.frames,
        "cpu_ms": rows,
        "new_over_long_lived": ratio,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
