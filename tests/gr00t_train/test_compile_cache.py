"""`optimizations.compile_cache`: torch.compile's cache artifacts in one file. A run writes it once its first
step has compiled and a run on empty local caches loads it and compiles nothing it holds, its multi-kernel
picks included, and a loaded file that served a graph it did not hold is replaced; a file of the artifacts
alone still loads; a damaged file is named and skipped; the trainer loads it (by default from its run folder)
before the blocks compile and saves it from the main rank."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import zipfile
from pathlib import Path

import pytest
import torch
from gr00t_train import Trainer
from gr00t_train.model import compile_cache_files
from gr00t_train.model.compile_cache import CompileCache


@pytest.fixture(autouse=True)
def _no_recording_left(monkeypatch):
    """Opening a cache to write adds a Triton load hook, the process's; taken away after each test."""
    monkeypatch.setattr(compile_cache_files, "_loaded_triton_folders", set())
    yield
    compile_cache_files.stop_recording()


def _scaled_sine(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def _fx_graph_counts() -> tuple[int, int]:
    counters = torch._dynamo.utils.counters["inductor"]
    return counters["fxgraph_cache_hit"], counters["fxgraph_cache_miss"]


@contextlib.contextmanager
def _fresh_host():
    """Empty Inductor and Triton caches and a reset torch.compile with cleared counters, as in a new process
    on a fresh host; reset again after."""
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        with fresh_cache():
            yield
    finally:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()


def _pick(key: str) -> Path:
    """Where Inductor keeps a multi-kernel's pick (CPU compiles make none)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / key[1:3] / f"{key}.picked_kernel"


def test_a_written_file_makes_empty_caches_hit(tmp_path) -> None:
    path = tmp_path / "compile" / "cache.bin"
    with _fresh_host():
        cache = CompileCache.open(path)
        assert cache.loaded_bytes == 0 and not path.exists()
        torch.compile(_scaled_sine)(torch.ones(8))
        assert _fx_graph_counts() == (0, 1)
        _pick("zabcdef").parent.mkdir(parents=True)
        _pick("zabcdef").write_text("1")
        cache.save()
        assert path.is_file() and cache.saved_bytes == path.stat().st_size > 0
        assert cache.files == {"picks": 1, "triton_kernels": 0}
        assert [p.name for p in path.parent.iterdir()] == ["cache.bin"]  # no partial file left
    with _fresh_host():  # another fresh host, with the file
        assert not _pick("zabcdef").exists()
        cache = CompileCache.open(path)
        assert cache.loaded_bytes == path.stat().st_size
        assert cache.files == {"picks": 1, "triton_kernels": 0} and _pick("zabcdef").read_text() == "1"
        x = torch.linspace(-1, 1, 8)
        assert torch.equal(torch.compile(_scaled_sine)(x), _scaled_sine(x))
        assert _fx_graph_counts() == (1, 0)  # the compiled graph came from the file
        cache.save()  # loaded: nothing to write
        assert cache.saved_bytes == 0


def _shifted_cosine(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) - 3


def test_a_loaded_file_that_served_nothing_new_is_replaced(tmp_path) -> None:
    """Loaded, then a graph it did not hold compiled (another GPU, torch or model): this host's file replaces it."""
    path = tmp_path / "cache.bin"
    with _fresh_host():
        first = CompileCache.open(path)
        torch.compile(_scaled_sine)(torch.ones(8))
        first.save()
    with _fresh_host():
        cache = CompileCache.open(path)
        assert cache.loaded_bytes == first.saved_bytes
        torch.compile(_shifted_cosine)(torch.ones(8))
        assert _fx_graph_counts() == (0, 1)
        cache.save()
        assert cache.saved_bytes == path.stat().st_size > 0
    with _fresh_host():
        CompileCache.open(path)
        torch.compile(_shifted_cosine)(torch.ones(8))
        assert _fx_graph_counts() == (1, 0)  # the new file holds what the second host compiled


def test_a_file_of_the_artifacts_alone_still_loads(tmp_path) -> None:
    path = tmp_path / "cache.bin"
    with _fresh_host():
        torch.compile(_scaled_sine)(torch.ones(8))
        path.write_bytes(torch.compiler.save_cache_artifacts()[0])  # as the first version wrote it
    with _fresh_host():
        cache = CompileCache.open(path)
        assert cache.loaded_bytes == path.stat().st_size
        torch.compile(_scaled_sine)(torch.ones(8))
        assert _fx_graph_counts() == (1, 0)


def test_a_damaged_file_is_named_and_the_run_compiles_without_it(tmp_path, caplog) -> None:
    path = tmp_path / "cache.bin"
    path.write_bytes(b"not torch.compile artifacts")
    with caplog.at_level(logging.WARNING, logger="gr00t_train.model.compile_cache"):
        cache = CompileCache.open(path)
    assert cache.loaded_bytes == 0
    assert any(
        str(path) in r.getMessage() and "could not be loaded" in r.getMessage() for r in caplog.records
    )


class _Artifacts:
    """torch.compiler's two calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def load(self, data: bytes):
        self.calls.append(f"load {data.decode()}")
        return "loaded"

    def save(self):
        self.calls.append("save")
        return b"compiled", None


@pytest.mark.parametrize(
    ("setting", "exists"), [("cache.bin", False), ("cache.bin", True), ("auto", False), ("auto", True)]
)
def test_the_trainer_loads_before_compiling_and_saves_after_the_first_step(
    tmp_path, env, standins, monkeypatch, setting, exists
) -> None:
    artifacts = _Artifacts()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # holds no picks
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", artifacts.load)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", artifacts.save)
    torch._dynamo.utils.counters.clear()  # nothing compiled anew in this process: a loaded file stays
    # auto: in the run folder, where a resumed run finds it
    path = tmp_path / "run" / "compile_cache.bin" if setting == "auto" else tmp_path / setting
    if exists:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"earlier")
    cfg = standins.small_config(
        tmp_path, steps=3, optimizations__compile="on", optimizations__compile_cache=setting
    )
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "run"))
    if setting != "auto":
        cfg = dataclasses.replace(
            cfg, optimizations=dataclasses.replace(cfg.optimizations, compile_cache=str(path))
        )
    parts = dataclasses.replace(
        standins.make_parts(), compile_model=lambda: artifacts.calls.append("compile") or 1
    )
    trainer = Trainer(cfg, parts, env)
    assert artifacts.calls == (["load earlier", "compile"] if exists else ["compile"])
    trainer.fit()
    assert artifacts.calls[-1] == ("compile" if exists else "save")  # written once, from the main rank
    if exists:
        assert path.read_bytes() == b"earlier"
    else:
        with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as archive:
            assert archive.namelist() == ["torch.bin"] and archive.read("torch.bin") == b"compiled"
    facts = json.loads((tmp_path / "run" / "summary.json").read_text())["compile_cache"]
    assert facts == {
        "path": str(path),
        "loaded_bytes": 7 * exists,
        "saved_bytes": 0 if exists else path.stat().st_size,
        "files": {"picks": 0, "triton_kernels": 0},
    }


def test_off_uses_no_file_and_auto_names_the_run_folder(tmp_path) -> None:
    assert CompileCache.path_for("off", tmp_path) is None and CompileCache.path_for("", tmp_path) is None
    assert CompileCache.path_for("auto", tmp_path / "run") == tmp_path / "run" / "compile_cache.bin"
    assert CompileCache.path_for("/shared/gr00t.bin", tmp_path) == Path("/shared/gr00t.bin")
