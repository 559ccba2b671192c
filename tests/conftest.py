"""Suite-wide pytest set-up: markers that skip tests the machine cannot run, and a check that no test leaves
process-wide state changed: torch's switches (a TF32 flag left on by one test changed another's numbers), the
environment (subprocesses inherit it), the SIGTERM/SIGINT handlers, and threads our packages start."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

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
    state = {
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
        # autocast left on turns a later fp32 product into a bf16 one (FrozenLinear follows autocast's dtype)
        "autocast.cuda": (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")),
        "autocast.cpu": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "autocast.cache_enabled": torch.is_autocast_cache_enabled(),
    }
    # which library serves GEMMs (cuBLAS or cuBLASLt: other kernels, other rounding), where torch has the switch
    if hasattr(torch.backends.cuda, "preferred_blas_library"):
        state["cuda.preferred_blas_library"] = torch.backends.cuda.preferred_blas_library()
    if hasattr(torch.backends.cuda, "preferred_linalg_library"):
        state["cuda.preferred_linalg_library"] = torch.backends.cuda.preferred_linalg_library()
    if hasattr(torch._C, "_get_sm_carveout_experimental"):  # fewer SMs: cuBLASLt picks other kernels
        state["sm_carveout"] = torch._C._get_sm_carveout_experimental()
    if hasattr(torch.serialization, "get_crc32_options"):  # a run turns torch.save's CRC-32 off while it runs
        state["save_crc32"] = torch.serialization.get_crc32_options()
    return state


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
    for device in ("cuda", "cpu"):
        enabled, dtype = state[f"autocast.{device}"]
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(state["autocast.cache_enabled"])
    if "cuda.preferred_blas_library" in state:
        torch.backends.cuda.preferred_blas_library(state["cuda.preferred_blas_library"])
    if "cuda.preferred_linalg_library" in state:
        torch.backends.cuda.preferred_linalg_library(state["cuda.preferred_linalg_library"])
    if "sm_carveout" in state:
        torch._C._set_sm_carveout_experimental(state["sm_carveout"])
    if "save_crc32" in state:
        torch.serialization.set_crc32_options(state["save_crc32"])


KEPT_ENV = {
    # Variables that libraries set once in this process and rely on later (their compile workers, later
    # loads read them); a test that sets one of them is not at fault.
    "TORCHINDUCTOR_CACHE_DIR": "Inductor writes its cache folder's absolute path on its first compile",
    "TRITON_CACHE_DIR": "Inductor names Triton's cache folder when it builds its first Triton kernel",
    "TRITON_PTXAS_PATH": "Inductor points Triton at torch's own ptxas, for its compile workers",
    "TRITON_LIBDEVICE_PATH": "Inductor points Triton at CUDA's libdevice, for its compile workers",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "Inductor's loader of compiled C++ kernels passes them an address",
    "DISABLE_CUPTI_LAZY_REINIT": "torch.profiler with CUDA graphs: CUPTI is not set up again in this process",
    "TEARDOWN_CUPTI": "torch.profiler with CUDA graphs: CUPTI is never torn down in this process",
    "SVT_LOG": "vla_io.testing's AV1 writer quiets SVT-AV1's banner for every later encoder (setdefault)",
    "KMP_DUPLICATE_LIB_OK": "set for good once Inductor has compiled (torch 2.11): a second OpenMP runtime may load",
    "KMP_INIT_AT_FORK": "set for good beside KMP_DUPLICATE_LIB_OK once Inductor has compiled (torch 2.11)",
}

PYTEST_ENV = {"PYTEST_CURRENT_TEST"}
"""Set by pytest itself around each phase of a test."""

SIGNALS = ("SIGTERM", "SIGINT")

THREAD_PREFIXES = ("gr00t-train", "vla-io", "prefix-cache")
"""Names of the threads our packages start: each must be joined (or have ended) when the test ends."""


def _changed(before: dict, after: dict) -> dict:
    """(before, after) of each key of `before` whose value differs after."""
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


def _env_changes(before: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    after = os.environ
    keys = (before.keys() | after.keys()) - KEPT_ENV.keys() - PYTEST_ENV
    return {k: (before.get(k), after.get(k)) for k in sorted(keys) if before.get(k) != after.get(k)}


def _restore_env(before: dict[str, str], changed: dict[str, tuple[str | None, str | None]]) -> None:
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            os.environ.pop(key, None)


def _handlers() -> dict[str, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {name: signal.getsignal(getattr(signal, name)) for name in SIGNALS}


def _our_threads(known: set[int]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIXES) and t.ident not in known]


def _left_running(known: set[int], grace_s: float = 2.0) -> list[threading.Thread]:
    """Our threads the test started that are still alive after a short grace (a thread told to stop may
    need a moment), and after the cyclic collector ran the finalizers of objects left to it."""
    left = _our_threads(known)
    if not left:
        return []  # the common case costs one enumerate()
    deadline = time.monotonic() + grace_s
    for attempt in range(2):
        for thread in left:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t for t in left if t.is_alive()]
        if not left or attempt:
            return left
        gc.collect()
        deadline = time.monotonic() + grace_s
    return left


@pytest.fixture(autouse=True)
def _process_state_is_restored():
    """Fails the test that changed process-wide state without restoring it (torch's switches, the
    environment, the SIGTERM/SIGINT handlers) and restores it, so the next test starts clean; fails the test
    that leaves one of our threads running."""
    torch_before, env_before, handlers_before = _global_torch_state(), dict(os.environ), _handlers()
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    problems = []
    torch_after = _global_torch_state()
    changed = _changed(torch_before, torch_after)
    if changed:
        _set_global_torch_state(torch_before)
        problems.append(f"the test left global torch state changed (before, after): {changed}; restore it")
    env_changed = _env_changes(env_before)
    if env_changed:
        _restore_env(env_before, env_changed)
        problems.append(f"the test left os.environ changed (before, after): {env_changed}; restore it")
    handlers_after = _handlers()
    moved = _changed(handlers_before, handlers_after)
    if moved:
        for name, (handler, _) in moved.items():
            if handler is not None:  # None: installed outside Python, cannot be put back from here
                signal.signal(getattr(signal, name), handler)
        problems.append(f"the test left signal handlers changed (before, after): {moved}; restore them")
    running = _left_running(threads_before)
    if running:
        names = sorted(t.name for t in running)
        problems.append(f"the test left threads running: {names}; join them when the test ends")
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture(scope="session", autouse=True)
def _private_vla_io_cache(tmp_path_factory):
    """What vla-io caches outside datasets (statistics, frames) goes to a temporary folder, not ~/.cache;
    subprocesses inherit it through the environment."""
    old = os.environ.get("VLA_IO_CACHE")
    os.environ["VLA_IO_CACHE"] = str(tmp_path_factory.mktemp("vla-io-cache"))
    yield
    if old is None:
        os.environ.pop("VLA_IO_CACHE", None)
    else:
        os.environ["VLA_IO_CACHE"] = old
