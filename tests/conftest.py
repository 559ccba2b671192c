"""Suite-wide pytest set-up: markers that skip tests the machine cannot run."""

from __future__ import annotations

import pytest


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    count = _cuda_count()
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    skip_multi = pytest.mark.skip(reason=f"needs >= 2 CUDA devices (found {count})")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and count < 2:
            item.add_marker(skip_multi)


@pytest.fixture(scope="session", autouse=True)
def _private_vla_io_cache(tmp_path_factory):
    """What vla-io caches outside datasets (statistics, frames) goes to a temporary folder, not ~/.cache;
    subprocesses inherit it through the environment."""
    import os

    old = os.environ.get("VLA_IO_CACHE")
    os.environ["VLA_IO_CACHE"] = str(tmp_path_factory.mktemp("vla-io-cache"))
    yield
    if old is None:
        os.environ.pop("VLA_IO_CACHE", None)
    else:
        os.environ["VLA_IO_CACHE"] = old
