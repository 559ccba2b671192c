"""The pre-capture check, on CPU: each kind of graph-unsafe code is named with its line and a fix."""

from __future__ import annotations

from pathlib import Path

import torch
from vla_graph import Finding, check_graph_safe
from vla_graph._explain import explain_capture_failure

HERE = "test_check.py"


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)


def _only(findings: list[Finding], kind: str) -> Finding:
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, findings
    return matching[0]


def test_a_clean_step_has_no_findings() -> None:
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    mask = torch.tensor([True, False, True])

    def step() -> None:
        y = torch.where(mask[:, None], x @ w, torch.zeros(()))
        (y.square().sum() / mask.sum().clamp_min(1)).backward()

    assert check_graph_safe(step) == []


def test_item_is_a_host_sync_named_with_its_line() -> None:
    x = torch.randn(3)

    def step() -> None:
        x.sum().item()  # MARK-item

    finding = _only(check_graph_safe(step, runs=1), "host sync")
    assert finding.op == ".item()"
    assert f"{HERE}:{_line_of('MARK-item')} (step)" in finding.where
    assert "keep the value on the device" in finding.advice.lower()
    assert "[host sync] .item() at" in str(finding)


def test_cpu_tolist_print_and_tensor_conditions_are_host_syncs(capsys) -> None:
    x = torch.randn(3)

    def step() -> None:
        x.cpu()
        x.tolist()
        print(x)
        if x.sum() > 0:
            pass

    ops = {f.op for f in check_graph_safe(step, runs=1) if f.kind == "host sync"}
    assert {".cpu()", ".tolist()", "printing a tensor", "bool(tensor) / `if tensor:`"} <= ops


def test_data_dependent_sizes_are_named() -> None:
    x = torch.randn(6)

    def step() -> None:
        x.nonzero()
        x[x > 0]  # MARK-mask
        y = x.clone()
        y[x > 0] = torch.ones(6)[x > 0]

    found = [f for f in check_graph_safe(step, runs=1) if f.kind == "data-dependent size"]
    details = " ".join(f.advice for f in found)
    assert "nonzero" in details and "boolean-mask indexing x[mask]" in details
    assert "assigning a tensor through a boolean mask" in details
    assert any(f"{HERE}:{_line_of('MARK-mask')}" in f.where for f in found)
    assert "masked_fill" in found[0].advice


def test_scalar_mask_assignment_is_allowed() -> None:
    x = torch.randn(6)

    def step() -> None:
        y = x.clone()
        y[x > 0] = 0.0  # a masked_fill, no data-dependent size

    assert check_graph_safe(step, runs=1) == []


def test_generators_must_be_registered() -> None:
    mine = torch.Generator().manual_seed(0)

    def step() -> None:
        torch.randn(3, generator=mine)
        torch.randn(3)  # the default generator is always captured
        torch.nn.functional.dropout(torch.ones(3), 0.5)

    finding = _only(check_graph_safe(step, runs=1), "unregistered generator")
    assert finding.op == "randn" and "generators=[...]" in finding.advice
    assert check_graph_safe(step, runs=1, generators=[mine]) == []


def test_python_branches_that_change_between_iterations_are_found() -> None:
    x = torch.randn(3)
    calls = []

    def step() -> None:
        calls.append(1)
        if len(calls) % 2:  # MARK-branch
            x.exp()
        else:
            x.sin()

    finding = _only(check_graph_safe(step, runs=2), "CPU-dependent branch")
    assert finding.op == "aten.exp.default then aten.sin.default"
    assert f"{HERE}:" in finding.where and "torch.where" in finding.advice


def test_extra_ops_in_one_iteration_are_a_branch() -> None:
    x = torch.randn(3)
    calls = []

    def step() -> None:
        calls.append(1)
        y = x * 2
        if len(calls) > 1:
            y.add_(1)

    finding = _only(check_graph_safe(step, runs=2), "CPU-dependent branch")
    assert "ran 1 op(s) in one iteration and 2 in the next" in finding.advice


def test_python_numbers_that_change_are_found() -> None:
    x = torch.randn(3)
    calls = []

    def step() -> None:
        calls.append(1)
        x.mul(1.0 / len(calls))  # MARK-number

    finding = _only(check_graph_safe(step, runs=3), "changing Python number")
    assert finding.op == "aten.mul.Tensor"
    assert f"{HERE}:{_line_of('MARK-number')}" in finding.where
    assert "0.5" in finding.advice and "0.333" in finding.advice and "as a tensor" in finding.advice


def test_host_syncs_inside_backward_are_located_in_backward() -> None:
    class Peek(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # noqa: ANN001
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001
            grad.max().item()  # MARK-backward
            return grad * 2

    w = torch.randn(3, requires_grad=True)

    def step() -> None:
        Peek.apply(w).sum().backward()

    finding = _only(check_graph_safe(step, runs=1), "host sync")
    assert f"{HERE}:{_line_of('MARK-backward')}" in finding.where and "in backward" in finding.where


def test_capture_failures_are_explained() -> None:
    cases = {
        "CUDA error: operation not permitted when stream is capturing": "host sync",
        "Cannot copy between CPU and CUDA tensors during CUDA graph capture": "copied a tensor between host and GPU",
        "CUDA error: capturing stream has unjoined work": "wait_stream(side)",
        "Attempt to increase offset for a CUDA generator not in capture mode": "generators=[...]",
        "Node 'X' has a stale reference to the default stream (stream 0) from warmup": "capture_stream()",
        "Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture": "Seed and save RNG state outside",
        "CUBLAS_STATUS_NOT_INITIALIZED when calling cublasCreate(handle)": "warmup_iters",
        "something new": "does not recognise",
    }
    for text, words in cases.items():
        message = explain_capture_failure(RuntimeError(text), [], what="microbatch 0", checked=False)
        assert message.startswith("CUDA graph capture of microbatch 0 failed:"), message
        assert words in message, (text, message)
        assert text in message and "check=True" in message


def test_capture_failure_explanations_look_through_chained_errors_and_warnings() -> None:
    try:
        try:
            raise RuntimeError("CUDA error: capturing stream has unjoined work")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture") from None
    except RuntimeError as error:
        hidden = error
    # `from None` hides the cause from tracebacks but __context__ keeps it; capture_end errors look like this.
    message = explain_capture_failure(
        hidden, ["AccumulateGrad node's stream does not match"], what="x", checked=True
    )
    assert "unjoined" in message and "saw nothing wrong" in message and "Warnings during capture" in message
