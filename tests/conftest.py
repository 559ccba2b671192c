"""Suite-wide pytest set-up: markers that skip tests the machine cannot run, and a check that no test leaves
torch's process-wide switches changed (a TF32 flag left on by one test changed another's numbers)."""

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


def _global_torch_state() -> dict[str, object]:
    """Process-wide torch switches that change numbers or behaviour of later code. The thread count is left
    out on purpose: tests pin it to 1 for speed on small machines, which changes no result they check."""
    import torch

    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return {
        "cuda.matmul.allow_tf32": matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": cudnn.allow_tf32,
        "cudnn.benchmark": cudnn.benchmark,
        "cudnn.deterministic": cudnn.deterministic,
        "cudnn.enabled": cudnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": torch.get_default_dtype(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "grad_enabled": torch.is_grad_enabled(),
        "anomaly_enabled": torch.is_anomaly_enabled(),
    }


def _set_global_torch_state(state: dict[str, object]) -> None:
    import torch

    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    matmul.allow_tf32 = state["cuda.matmul.allow_tf32"]
    matmul.allow_fp16_reduced_precision_reduction = state[
        "cuda.matmul.allow_fp16_reduced_precision_reduction"
    ]
    matmul.allow_bf16_reduced_precision_reduction = state[
        "cuda.matmul.allow_bf16_reduced_precision_reduction"
    ]
    cudnn.allow_tf32, cudnn.benchmark = state["cudnn.allow_tf32"], state["cudnn.benchmark"]
    cudnn.deterministic, cudnn.enabled = state["cudnn.deterministic"], state["cudnn.enabled"]
    torch.set_float32_matmul_precision(state["float32_matmul_precision"])
    torch.set_default_dtype(state["default_dtype"])
    torch.use_deterministic_algorithms(state["deterministic_algorithms"])
    torch.set_grad_enabled(state["grad_enabled"])
    torch.autograd.set_detect_anomaly(state["anomaly_enabled"])


@pytest.fixture(autouse=True)
def _torch_global_state_is_restored():
    """Fails the test that changed a process-wide torch switch without restoring it (and restores it, so
    the next test starts clean)."""
    before = _global_torch_state()
    yield
    after = _global_torch_state()
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    if changed:
        _set_global_torch_state(before)
        pytest.fail(f"the test left global torch state changed (before, after): {changed}; restore it")


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
