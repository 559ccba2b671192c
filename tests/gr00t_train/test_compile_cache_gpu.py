"""A Triton kernel of ours (vla-overlap's gradient cast) carried by `optimizations.compile_cache` to a fresh
host (run on a GPU host: `pytest tests/gr00t_train/test_compile_cache_gpu.py -m gpu`). A process on empty
caches launches it with Triton's load hook recording; a second process on other empty caches restores what the
first collected and launches it again: Triton finds the kernel there and compiles nothing (its cache gains no
folder holding a cubin; Triton's own launcher modules, built per host, are not carried), and the result is the
same."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

_SCRIPT = textwrap.dedent(
    """
    import pickle, sys
    import torch
    from gr00t_train.model import compile_cache_files as files
    from vla_overlap._cast_kernel import cast_into

    carried, restore = sys.argv[1], sys.argv[2] == "restore"
    if restore:
        with open(carried, "rb") as f:
            print("restored", files.restore(pickle.load(f)))
    files.record_triton_kernel_loads()
    source = torch.arange(5000, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    target = torch.zeros(5000, device="cuda")
    cast_into(target, source)
    torch.cuda.synchronize()
    assert torch.equal(target, source.float())
    if not restore:
        with open(carried, "wb") as f:
            pickle.dump(files.collect(), f)
    """
)


def _run(tmp_path, host: str, carried, mode: str) -> str:
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / host / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / host / "triton"),
    )
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(carried), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_our_kernel_compiles_once_across_hosts(tmp_path) -> None:
    carried = tmp_path / "carried.pkl"
    _run(tmp_path, "first", carried, "collect")
    names = pickle.loads(carried.read_bytes())
    kernels = {name.split("/")[1] for name in names if name.startswith("triton/")}
    assert len(kernels) == 1 and any(name.endswith(".json") and "__grp__" in name for name in names)

    out = _run(tmp_path, "fresh", carried, "restore")
    assert "'triton_kernels': 1" in out
    compiled = {p.parent.name for p in (tmp_path / "fresh" / "triton").glob("*/*.cubin")}
    assert compiled == kernels  # the launch compiled nothing: no cubin of its own
