"""_inductor_cache: kernels that Inductor's FX graph cache hands back as static autotuners get a usable hash
lock, so a multi-kernel graph (whose MultiKernelCall reads each kernel's cache_key) loads in a second process."""

from __future__ import annotations

import threading
import types

import pytest
import torch
from gr00t_model._inductor_cache import let_multi_kernels_load_from_cache

codecache = pytest.importorskip("torch._inductor.codecache")
multi_kernel = pytest.importorskip("torch._inductor.codegen.multi_kernel")


@pytest.fixture(autouse=True)
def _unwrapped():
    """Each test starts from torch's own methods and leaves them as they were."""
    saved = [(owner, name, vars(owner)[name]) for owner, name in (
        (multi_kernel.MultiKernelCall, "load_cache"), (getattr(codecache, "StaticAutotunerFuture", None), "result")
    ) if owner is not None]  # fmt: skip
    for owner, name, method in saved:
        setattr(owner, name, getattr(method, "__wrapped__", method))
    yield
    for owner, name, method in saved:
        setattr(owner, name, method)


class _PickledFunction:
    """Triton's JITFunction as prepare_for_pickle leaves it: its hash kept, its lock dropped (cache_key takes
    the lock first, as Triton's does)."""

    def __init__(self) -> None:
        self.hash, self._hash_lock = "abc", None

    @property
    def cache_key(self) -> str:
        with self._hash_lock:
            return self.hash


def _pickled_kernel() -> types.SimpleNamespace:
    """A stand-in for a CachingAutotuner after prepare_for_pickle."""
    kernel = types.SimpleNamespace(fn=_PickledFunction(), size_hints={"x": 1024}, triton_meta={})
    kernel.recheck_autotune_cache = lambda **_: None
    kernel.precompile = lambda **_: None
    return kernel


def test_a_multi_kernel_reads_the_keys_of_kernels_that_lost_their_lock(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_DISABLE_MULTI_KERNEL_CACHE", raising=False)
    with pytest.raises((AttributeError, TypeError)):  # the failure: `with None`
        multi_kernel.MultiKernelCall("k", [_pickled_kernel(), _pickled_kernel()], [[0], [0]])
    assert let_multi_kernels_load_from_cache()
    kernels = [_pickled_kernel(), _pickled_kernel()]
    call = multi_kernel.MultiKernelCall("k", kernels, [[0], [0]])
    assert call.picked_kernel is None  # nothing picked before in this cache
    assert all(k.fn.cache_key == "abc" for k in kernels)


def test_static_autotuners_come_back_with_a_lock() -> None:
    if not hasattr(codecache, "StaticAutotunerFuture"):
        pytest.skip("this torch loads no static autotuners from the FX graph cache")
    original = codecache.StaticAutotunerFuture.result
    try:
        assert let_multi_kernels_load_from_cache() and let_multi_kernels_load_from_cache()
        wrapped = codecache.StaticAutotunerFuture.result
        assert (
            wrapped is not original and wrapped.__wrapped__ is original
        )  # wrapped once, however often called
        future = codecache.StaticAutotunerFuture(_pickled_kernel())
        future.reload_kernel_from_src = lambda: None
        kernel = future.result()
        assert isinstance(kernel.fn._hash_lock, type(threading.RLock()))
        with kernel.fn._hash_lock:  # what triton's JITFunction.cache_key does first
            pass
    finally:
        codecache.StaticAutotunerFuture.result = original


def test_a_triton_function_without_its_lock_cannot_give_its_key() -> None:
    """The failure the fix is for, on Triton's own class (no GPU needed to hash a kernel's source)."""
    triton = pytest.importorskip("triton")
    from gr00t_model._inductor_cache import _give_lock

    @triton.jit
    def add_one(x_ptr):
        triton.language.store(x_ptr, triton.language.load(x_ptr) + 1)

    if not hasattr(add_one, "_hash_lock"):
        pytest.skip("this Triton keeps no hash lock")
    key = add_one.cache_key
    add_one._hash_lock = None  # as prepare_for_pickle leaves it
    with pytest.raises((AttributeError, TypeError)):
        _ = add_one.cache_key
    _give_lock(types.SimpleNamespace(fn=add_one))
    assert add_one.cache_key == key


def test_compile_blocks_applies_it_and_keeps_the_fx_graph_cache(monkeypatch) -> None:
    from unittest import mock

    from gr00t_model import GR00TN16, GR00TConfig, _model

    calls = []
    monkeypatch.setattr(_model, "let_multi_kernels_load_from_cache", lambda: calls.append(1) or True)
    model = GR00TN16(GR00TConfig.preset("tiny"))
    with mock.patch.object(torch, "compile", lambda fn, **kw: fn):
        model.compile_blocks()
        model.uncompile_blocks()
        model.compile_blocks(backend="aot_eager")
        model.uncompile_blocks()
    assert calls == [1]  # Inductor only
    assert "fx_graph_cache" not in _model.INDUCTOR_OPTIONS


def _doubling(backward_scale: float) -> type[torch.autograd.Function]:
    """A custom autograd.Function as vla_overlap's grad-in-bucket Linear is one: y = 2x, with a backward of
    its own (scaled by `backward_scale`, so a changed backward is a different Function)."""

    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * backward_scale

    return Doubling


def _compile_and_step(
    function: type[torch.autograd.Function], wrap
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A fresh compile (as in a new process) of sin -> function -> sum, its forward called through `wrap`
    and its backward run after the call has returned, as a training step does. Returns AOTAutograd's cache
    counters, the input and its gradient."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = wrap(torch.compile(lambda x: function.apply(x.sin()).sum(), dynamic=False))
    x = torch.randn(8, requires_grad=True)
    compiled(x).backward()
    return dict(counters["aot_autograd"]), x, x.grad


def test_custom_autograd_functions_load_from_the_aot_autograd_cache() -> None:
    from torch._functorch import config
    from torch._inductor.utils import fresh_cache

    if not hasattr(config, "autograd_cache_allow_custom_autograd_functions"):
        pytest.skip("this torch has no flag for caching custom autograd Functions")
    from gr00t_model._inductor_cache import caching_custom_functions

    with fresh_cache():
        plain, _, _ = _compile_and_step(_doubling(2.0), lambda f: f)
        assert plain.get("autograd_cache_bypass") == 1  # torch's default: such graphs are never cached
        first, _, _ = _compile_and_step(_doubling(2.0), caching_custom_functions)
        assert first.get("autograd_cache_saved") == 1
        assert config.autograd_cache_allow_custom_autograd_functions is False  # scoped to the call
        again, x, grad = _compile_and_step(_doubling(2.0), caching_custom_functions)
        assert again.get("autograd_cache_hit") == 1 and "autograd_cache_miss" not in again
        torch.testing.assert_close(grad, x.detach().cos() * 2.0)
        changed, x, grad = _compile_and_step(_doubling(3.0), caching_custom_functions)
        assert changed.get("autograd_cache_miss") == 1  # the key holds the backward that Dynamo traced
        torch.testing.assert_close(grad, x.detach().cos() * 3.0)
    torch._dynamo.reset()
