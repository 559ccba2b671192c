"""Turn CUDA's capture errors into sentences a user can act on."""

from __future__ import annotations

# (substrings to look for, lower case; what happened and what to do). First match wins: most specific first.
_KNOWN: list[tuple[tuple[str, ...], str]] = [
    (
        ("not in capture mode", "increase offset", "rng op during graph capture", "offset increment outside"),
        "the step drew random numbers from a torch.Generator that was not registered with the graph. "
        "Pass it as GraphedStep(generators=[...]) or draw the numbers outside the step with draw=",
    ),
    (
        ("cannot copy between cpu and cuda",),
        "a host sync: the step copied a tensor between host and GPU (.cpu(), .to('cpu'), torch.tensor(...) of host data "
        "moved to the GPU, indexing with a CPU tensor). Move such copies outside the step: pass host data "
        "in the batch so it is copied into a static buffer before replay",
    ),
    (
        ("unjoined",),
        "the step launched work on another CUDA stream and did not join it back before the step ended. "
        "After `with torch.cuda.stream(side): ...`, call torch.cuda.current_stream().wait_stream(side) "
        "(and wait every async collective handle inside the step)",
    ),
    (
        ("accumulategrad", "stale"),
        "autograd's AccumulateGrad nodes were created on another stream than the capture stream (a "
        "wrapper that retains them was built on the default stream). Build the wrapper inside "
        "`with vla_graph.capture_stream():`, or on torch >= 2.13 call "
        "torch.autograd.graph.set_override_stale_capture_stream(True)",
    ),
    (
        ("uncaptured work", "isolation"),
        "the capture stream was made to wait on work outside the capture (wait_stream or wait_event on a "
        "stream or event recorded before capture). Inside the step, only wait on streams that first "
        "waited on the current stream",
    ),
    (
        ("cudageneratorimpl::",),
        "the step read or set a random generator's state (manual_seed, get_rng_state, initial_seed) "
        "while capturing. Seed and save RNG state outside the step; draw random inputs with draw=",
    ),
    (
        ("implicit", "legacy stream"),
        "the step used the legacy default stream (or another thread used CUDA) while capturing. Use "
        "GraphConfig(capture_error_mode='thread_local') and avoid torch.cuda.default_stream() in the step",
    ),
    (
        ("not permitted when stream is capturing", "captureunsupported", "capture_unsupported"),
        "an operation that the GPU cannot record ran during capture: a host sync (.item(), .cpu(), "
        "printing a tensor, `if tensor:`, nonzero, boolean-mask indexing), torch.cuda.synchronize(), an "
        "event or stream query, or a pinned-memory allocation. Keep such code outside the step",
    ),
    (
        ("cublas", "cudnn", "cufft", "no warmup iterations"),
        "a math library created handles or workspaces during capture. Increase GraphConfig.warmup_iters "
        "so they exist before capture",
    ),
    (
        ("invalidated", "previous error during capture"),
        "an earlier operation invalidated the capture (see the first error and the warnings below)",
    ),
]


def _chain(error: BaseException) -> list[BaseException]:
    """The error and everything it was raised from or during (capture_end errors hide the first one)."""
    seen: list[BaseException] = []
    stack = [error]
    while stack:
        current = stack.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        stack += [current.__cause__, current.__context__]
    return seen


def explain_capture_failure(
    error: BaseException, warning_messages: list[str], *, what: str, checked: bool
) -> str:
    """A message naming the likely cause of a failed capture, the fix, and the original errors."""
    messages = [f"{type(e).__name__}: {e}" for e in _chain(error)]
    text = "\n".join(messages + warning_messages).lower()
    cause = next(
        (advice for needles, advice in _KNOWN if any(n in text for n in needles)),
        "CUDA rejected the capture for a reason vla_graph does not recognise (see the errors below)",
    )
    lines = [f"CUDA graph capture of {what} failed: {cause}."]
    if checked:
        lines.append(
            "The pre-capture check saw nothing wrong, so the cause is in code it cannot see "
            "(torch.cuda.synchronize, streams and events, C++/Triton extensions, other threads)."
        )
    else:
        lines.append(
            "Run with GraphConfig(check=True) to have the offending op and line named before capture."
        )
    lines.append(
        "A failed capture can leave CUDA's random generators unusable in this process; restart it "
        "after fixing the step."
    )
    lines += ["Errors:"] + [f"  {m.splitlines()[0] if m else m}" for m in messages]
    if warning_messages:
        lines += ["Warnings during capture:"] + [f"  {w.splitlines()[0]}" for w in warning_messages[:5]]
    return "\n".join(lines)
