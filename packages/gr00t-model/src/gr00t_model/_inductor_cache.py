"""Lets a multi-kernel graph load back from Inductor's FX graph cache (torch 2.11 and later, CUDA).

A graph compiled with `triton.multi_kernel` holds each reduction as a MultiKernelCall over two Triton kernels.
When the graph comes back from the FX graph cache, its kernels come as the statically launchable autotuners
saved with it: pickled after `CachingAutotuner.prepare_for_pickle`, which sets the kernel's `fn._hash_lock` to
None, and handed out by `StaticAutotunerFuture.result` without putting a lock back. MultiKernelCall reads
`fn.cache_key` (which takes that lock) to find the sub-kernel it picked last time, so the second process
failed at its first compiled call. Giving the kernel a fresh lock there is all that is missing: the kernel's
hash itself was saved with it, so the key reads the same as in the process that compiled it.

`caching_custom_functions` lets a compiled graph holding a custom autograd.Function (vla_overlap's Linear
that writes its weight gradient into the bucket) load from the AOTAutograd cache too. torch bypasses that cache
for such graphs by default ("Unsupported call_function target autograd_function_apply"), so every warm start
traced and partitioned the trainable blocks again (3-4 s on an H200 host). The key holds the forward and
backward Dynamo traced from the Function, so a changed Function misses; the flag is scoped to our compiled
calls rather than set for the whole process.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any


def _give_lock(kernel: Any) -> None:
    fn = getattr(kernel, "fn", None)
    if fn is not None and hasattr(fn, "_hash_lock") and fn._hash_lock is None:
        fn._hash_lock = threading.RLock()


def let_multi_kernels_load_from_cache() -> bool:
    """Give every kernel a usable hash lock before MultiKernelCall reads its key (wrapping
    `MultiKernelCall.load_cache`), and every kernel `StaticAutotunerFuture.result` hands out one too; once per
    process. Returns whether this torch has multi-kernels to fix."""
    try:
        from torch._inductor.codegen.multi_kernel import MultiKernelCall
    except ImportError:
        return False
    load_cache = MultiKernelCall.load_cache
    if not getattr(load_cache, "_gives_hash_lock", False):

        @functools.wraps(load_cache)
        def load_cache_with_locks(self: Any, *args: Any, **kwargs: Any) -> Any:
            for kernel in self.kernels:  # resolves the kernels' futures, as the key reads them anyway
                _give_lock(kernel)
            return load_cache(self, *args, **kwargs)

        load_cache_with_locks._gives_hash_lock = True  # type: ignore[attr-defined]
        MultiKernelCall.load_cache = load_cache_with_locks  # type: ignore[method-assign]
    try:
        from torch._inductor.codecache import StaticAutotunerFuture
    except ImportError:
        return True
    result = StaticAutotunerFuture.result
    if not getattr(result, "_gives_hash_lock", False):

        @functools.wraps(result)
        def result_with_lock(self: Any, *args: Any, **kwargs: Any) -> Any:
            _give_lock(getattr(self, "static_autotuner", None))  # before: loading it may read the key too
            kernel = result(self, *args, **kwargs)
            _give_lock(kernel)
            return kernel

        result_with_lock._gives_hash_lock = True  # type: ignore[attr-defined]
        StaticAutotunerFuture.result = result_with_lock  # type: ignore[method-assign]
    return True


def caching_custom_functions(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled` (a torch.compile'd callable), calling it with custom autograd.Functions cacheable by
    AOTAutograd: its compiles, which happen inside the call, read the flag then. A plain attribute swap, not
    config.patch: it runs on every call (about 1 us)."""
    try:
        from torch._functorch import config
    except ImportError:
        return compiled
    if not hasattr(config, "autograd_cache_allow_custom_autograd_functions"):
        return compiled

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        before = config.autograd_cache_allow_custom_autograd_functions
        config.autograd_cache_allow_custom_autograd_functions = True
        try:
            return compiled(*args, **kwargs)
        finally:
            config.autograd_cache_allow_custom_autograd_functions = before

    return call
