"""What `optimizations.compile_cache` carries beside torch's artifacts: Inductor's multi-kernel picks and the
Triton kernels this process loaded outside Inductor's graphs, restored on another host where its Inductor and
Triton look for them (Triton's own cache manager finds the kernel's files there), never over what that host
has, and never outside those caches."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from gr00t_train.model import compile_cache_files as files

triton = pytest.importorskip("triton")  # ships with CUDA builds of torch, which these tests run on


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Point Inductor's and Triton's caches at a folder of `name`, as if on that host; no folder recorded."""
    monkeypatch.setattr(files, "_loaded_triton_folders", set())

    def use(name: str) -> tuple[Path, Path]:
        inductor, triton_dir = tmp_path / name / "inductor", tmp_path / name / "triton"
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
        return inductor, triton_dir

    return use


def _triton_folder(base: Path, key: str, kernel: str) -> dict[str, str]:
    """A Triton cache folder as Triton writes it (its group file names the files by absolute path); returns
    the kernel's metadata group, as Triton's load hook gets it."""
    folder = base / key
    folder.mkdir(parents=True)
    group = {}
    for suffix, data in ((".cubin", b"\x7fELF kernel"), (".json", b'{"name": "%s"}' % kernel.encode())):
        (folder / f"{kernel}{suffix}").write_bytes(data)
        group[f"{kernel}{suffix}"] = str(folder / f"{kernel}{suffix}")
    (folder / f"__grp__{kernel}.json").write_text(json.dumps({"child_paths": group}))
    return group


def test_picks_and_our_kernels_reach_a_fresh_host(host) -> None:
    inductor, triton_dir = host("first")
    (inductor / "ab").mkdir(parents=True)
    (inductor / "ab" / "zabc.picked_kernel").write_text("1")
    ours = _triton_folder(triton_dir, "OURKEY", "cast_grad_kernel")
    inductors = _triton_folder(triton_dir, "INDKEY", "triton_red_fused_sum_0")
    files._record_triton_load(None, None, "cast_grad_kernel", ours, "OURKEY")
    files._record_triton_load(
        None, None, "triton_red_fused_sum_0", inductors, "INDKEY"
    )  # in torch's artifacts
    carried = files.collect()
    assert sorted(carried) == [
        "inductor/ab/zabc.picked_kernel",
        "triton/OURKEY/__grp__cast_grad_kernel.json",
        "triton/OURKEY/cast_grad_kernel.cubin",
        "triton/OURKEY/cast_grad_kernel.json",
    ]
    assert files.count(carried) == {"picks": 1, "triton_kernels": 1}

    inductor, triton_dir = host("fresh")
    assert files.restore(carried) == {"picks": 1, "triton_kernels": 1}
    assert (inductor / "ab" / "zabc.picked_kernel").read_text() == "1"
    group = triton.runtime.cache.FileCacheManager("OURKEY").get_group("cast_grad_kernel.json")
    assert group == {name: str(triton_dir / "OURKEY" / name) for name in ours}  # where Triton looks now
    assert Path(group["cast_grad_kernel.cubin"]).read_bytes() == b"\x7fELF kernel"
    assert sorted(p.name for p in triton_dir.iterdir()) == ["OURKEY"]  # no temporary folder left


def test_what_a_host_has_is_kept(host) -> None:
    inductor, triton_dir = host("fresh")
    (inductor / "ab").mkdir(parents=True)
    (inductor / "ab" / "zabc.picked_kernel").write_text("0")
    _triton_folder(triton_dir, "OURKEY", "cast_grad_kernel")
    carried = {
        "inductor/ab/zabc.picked_kernel": b"1",
        "triton/OURKEY/cast_grad_kernel.cubin": b"another build",
        "triton/OURKEY/__grp__cast_grad_kernel.json": b'{"child_paths": {}}',
    }
    assert files.restore(carried) == {"picks": 0, "triton_kernels": 0}
    assert (inductor / "ab" / "zabc.picked_kernel").read_text() == "0"
    assert (triton_dir / "OURKEY" / "cast_grad_kernel.cubin").read_bytes() == b"\x7fELF kernel"


def test_names_outside_the_caches_are_skipped_and_named(host, tmp_path, caplog) -> None:
    host("fresh")
    carried = {
        "inductor/../../escaped.picked_kernel": b"1",
        "triton/../escaped/file": b"x",
        "triton/KEY/../../escaped": b"x",
        "elsewhere/ab/file.picked_kernel": b"1",
        "inductor/ab/not_a_pick.py": b"import os",
    }
    with caplog.at_level(logging.WARNING, logger=files.__name__):
        assert files.restore(carried) == {"picks": 0, "triton_kernels": 0}
    assert not list(tmp_path.rglob("escaped*")) and not list(tmp_path.rglob("*.py"))
    skipped = " ".join(r.getMessage() for r in caplog.records)
    assert all(repr(name) in skipped for name in carried)


def test_the_load_hook_is_added_once_and_records_triton_loads() -> None:
    chain = triton.knobs.runtime.kernel_load_end_hook
    before = list(chain.calls)
    assert files._record_triton_load not in before
    try:
        assert files.record_triton_kernel_loads() and files.record_triton_kernel_loads()
        assert chain.calls == [*before, files._record_triton_load]
        files.stop_recording()
        assert chain.calls == before
    finally:
        chain.remove(files._record_triton_load)


def test_every_rank_stops_recording_after_the_first_step(tmp_path) -> None:
    from gr00t_train.model.compile_cache import CompileCache

    chain = triton.knobs.runtime.kernel_load_end_hook
    try:
        for write in (False, True):  # another rank, then the main rank (which writes the file)
            cache = CompileCache.open(tmp_path / f"cache_{write}.bin")
            assert files._record_triton_load in chain.calls
            cache.after_first_step(write=write)
            assert files._record_triton_load not in chain.calls
    finally:
        chain.remove(files._record_triton_load)
