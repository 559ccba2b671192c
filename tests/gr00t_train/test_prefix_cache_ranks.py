"""data.prefix_cache with two processes (torchrun, gloo, CPU): each builds its share of the samples into the
same disk cache, which equals a one-process build byte for byte, and the run trains like two processes
reading video."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _torchrun import torchrun

_WORKER = """
import sys
import torch
import gr00t_train
from gr00t_train.model import build as _build
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
out, *sets = sys.argv[1:]
base = ["data.dataset=" + {dataset!r}, f"output_dir={{out}}", "device=cpu", "steps=4", "data.batch_size=4",
        "data.num_workers=0", "data.val_episodes=0", "eval.every=0", "logging.every=1", "logging.progress=false",
        "logging.plots=false", "checkpoint.save_final=false"]
cfg = gr00t_train.load_config(preset="demo", overrides=[*base, *sets])
gr00t_train.Trainer(cfg, _build.build_parts(cfg, env), env).fit()
gr00t_train.shutdown_distributed(env)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    import vla_io

    root = tmp_path_factory.mktemp("data") / "libero-like"
    vla_io.write_synthetic_dataset(
        root, vla_io.testing.SynthConfig(episodes=2, episode_length=16, image_size=64, codec="h264")
    )
    return root


def _run(script: Path, out: Path, *sets: str, nproc: int = 2) -> list[float]:
    code, output = torchrun(str(script), str(out), *sets, nproc=nproc, timeout=280)
    assert code == 0, output[-5000:]
    with (out / "metrics.jsonl").open() as lines:
        return [json.loads(line)["loss"] for line in lines]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_build_one_cache_and_train_like_video(dataset, tmp_path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_WORKER.format(dataset=str(dataset))))
    cache = ("data.prefix_cache.mode=disk", "precision=bf16")
    plain = _run(script, tmp_path / "plain", "precision=bf16")
    cached = _run(script, tmp_path / "cached", *cache, f"data.prefix_cache.dir={tmp_path / 'two'}")
    assert len(plain) == 4 and cached == plain

    _run(script, tmp_path / "one", *cache, f"data.prefix_cache.dir={tmp_path / 'one'}", "steps=1", nproc=1)
    (two,), (one,) = (list((tmp_path / name).glob("[!.]*/")) for name in ("two", "one"))
    assert two.name == one.name  # the fingerprint does not depend on the number of processes
    files = sorted(path.name for path in one.iterdir())
    assert files == sorted(path.name for path in two.iterdir()) and "hidden.bin" in files
    for name in files:
        if name.endswith(".bin"):
            assert (one / name).read_bytes() == (two / name).read_bytes(), name
