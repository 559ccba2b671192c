from __future__ import annotations

import pytest
import torch
from vla_graph import ShapeChangeError, StaticInputs


def _batch(n: int = 2) -> dict:
    return {
        "x": torch.randn(n, 3),
        "ids": torch.arange(n),
        "views": [torch.ones(n, 2), torch.zeros(n)],
        "tag": 7,
    }


def test_fill_copies_into_fixed_addresses() -> None:
    static = StaticInputs(_batch(), "cpu")
    addresses = [static.tree["x"].data_ptr(), static.tree["views"][0].data_ptr()]
    for _ in range(2):
        batch = _batch()
        tree = static.fill(batch)
        assert tree is static.tree
        assert torch.equal(tree["x"], batch["x"]) and torch.equal(tree["views"][0], batch["views"][0])
        assert tree["x"].data_ptr() != batch["x"].data_ptr()
    assert [static.tree["x"].data_ptr(), static.tree["views"][0].data_ptr()] == addresses
    assert static.tree["tag"] == 7


def test_filling_with_its_own_buffers_is_a_no_op() -> None:
    static = StaticInputs(_batch(), "cpu")
    static.fill(_batch())
    before = static.tree["x"].clone()
    assert static.fill(static.tree) is static.tree and torch.equal(static.tree["x"], before)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda b: b.update(x=torch.randn(3, 3)), "batch['x'] has shape (3, 3) instead of (2, 3)"),
        (lambda b: b.update(ids=b["ids"].int()), "dtype torch.int32 instead of torch.int64"),
        (lambda b: b.update(x=torch.empty(2, 3, device="meta")), "device meta instead of cpu"),
        (lambda b: b.pop("ids"), "batch['ids'] is missing"),
        (lambda b: b.update(extra=torch.ones(1)), "batch['extra'] is new"),
        (
            lambda b: b.update(tag=8),
            "batch['tag'] is the Python int 8, but the graph was captured with the Python int 7",
        ),
        (lambda b: b["views"].append(torch.ones(1)), "batch['views'][2] is new"),
    ],
)
def test_a_different_batch_raises_naming_the_key(change, words: str) -> None:
    static = StaticInputs(_batch(), "cpu")
    batch = _batch()
    change(batch)
    assert not static.matches(batch)
    with pytest.raises(ShapeChangeError, match="does not match the captured graph") as info:
        static.fill(batch)
    assert words in str(info.value) and "on_shape_change='recapture'" in str(info.value)


def test_unsupported_leaves_are_rejected_with_their_path() -> None:
    with pytest.raises(TypeError, match=r"batch\['obj'\] is a object"):
        StaticInputs({"obj": object()}, "cpu")
    with pytest.raises(TypeError, match=r"batch\['w'\] requires grad"):
        StaticInputs({"w": torch.ones(2, requires_grad=True)}, "cpu")
