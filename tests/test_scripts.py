"""The repository's shell scripts: `source scripts/env.sh` must leave the caller's shell as it was."""

from __future__ import annotations

import subprocess

from _boundaries import REPO


def test_sourcing_env_sh_leaves_no_errexit_or_pipefail_behind() -> None:
    # `set -eo pipefail` at the top of a sourced script stays set in the caller's shell: the next failing
    # command there would close an interactive terminal.
    script = 'set +e +o pipefail; source scripts/env.sh >/dev/null || exit 9; echo "opts=$-"; set -o | grep pipefail; echo "venv=$VIRTUAL_ENV"; declare -F | grep -c _vla_env || true'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    opts = next(line for line in lines if line.startswith("opts="))
    assert "e" not in opts.removeprefix("opts=")
    assert any(line.startswith("pipefail") and line.endswith("off") for line in lines)
    assert any(line.startswith("venv=") and len(line) > len("venv=") for line in lines)  # activated
    assert lines[-1] == "0"  # its helper function is gone too


def test_step_timeline_reads_one_step_between_side_stream_starts(tmp_path) -> None:
    # benchmarks/step_timeline.py on a made-up trace: three steps of 100 us; each has an update on the side
    # stream (tid 2) at its start, then on the compute stream (tid 1) a memset, a 2 us gap, a GEMM, a 1 us gap
    # and a Triton kernel.
    import gzip
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import step_timeline
    finally:
        sys.path.pop(0)
    events = []
    for step in range(4):
        t = step * 5000.0
        events += [
            {"ph": "X", "cat": "kernel", "name": "_adamw_blocks_kernel", "tid": 2, "ts": t, "dur": 30.0},
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "tid": 1, "ts": t + 40, "dur": 1.0},
            {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "tid": 1, "ts": t + 43, "dur": 20.0},
            {"ph": "X", "cat": "kernel", "name": "triton_poi_add", "tid": 1, "ts": t + 64, "dur": 5.0},
        ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    loaded = step_timeline.load(path)
    start, stop = step_timeline.step_window(loaded, main=1)
    assert (start, stop) == (5000.0, 10000.0)
    found = step_timeline.summarize(loaded, start, stop, main=1, top=3)
    assert found["busy_ms_by_stream"] == {"1": 0.03, "2": 0.03}
    assert found["compute_stream"]["kernels"] == 3
    assert found["by_family"]["memset"] == {"kernels": 1, "ms": 0.0, "gaps_after_ms": 0.0}  # 2 us rounds to 0
    assert found["top_with_gaps"][0] == ["nvjet_sm90_gemm", 1, 0.021]  # 20 us and the 1 us gap after it
    assert step_timeline.bins(loaded, start, stop, main=1, width_ms=0.05) == [
        {"from_ms": 0.0, "compute_ms": 0.021, "other_ms": 0.03, "kernels": 2},  # update, memset, GEMM
        {"from_ms": 0.05, "compute_ms": 0.005, "other_ms": 0.0, "kernels": 1},  # the Triton kernel at 64 us
        *(
            {"from_ms": round(i * 0.05, 3), "compute_ms": 0.0, "other_ms": 0.0, "kernels": 0}
            for i in range(2, 101)
        ),
    ]
    listed = step_timeline.kernel_list(loaded, start, stop, main=1)
    assert [(at, us, gap) for at, us, gap, _ in listed] == [
        (0.04, 1.0, 0.0),
        (0.043, 20.0, 2.0),
        (0.064, 5.0, 1.0),
    ]
