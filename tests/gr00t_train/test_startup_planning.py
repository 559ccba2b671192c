"""The flat optimizer's start-up planning on n1.6-3b-sized parameter lists (sizes from the model built on the
meta device, laid out by vla_overlap.plan_layout as the trainer lays them out): the array planners give the
blocks, idle-row flags and stage split of the element-by-element reference, bucket by bucket."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from gr00t_model import GR00TN16, GR00TConfig
from gr00t_train._comm import bucket_elements
from vla_overlap import plan_layout
from vla_overlap._block_plan import as_tuples, block_table, flag_index
from vla_overlap._flat_adamw import ALIGN, BLOCK
from vla_overlap._update_stages import split_by_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vla_overlap"))
import _planning_reference as reference  # noqa: E402


def n16_bucket_plans() -> list[dict]:
    """Per bucket (rank 0 of one): runs with two rows (every seventh slot lagging, so runs split), the row cuts
    and spans of the 3-D embodiment tables (as FlatAdamW.track_rows tracks them), and a stage per piece."""
    with torch.device("meta"):
        model = GR00TN16(GR00TConfig.preset("n1.6-3b"))
    params = [p for p in model.parameters() if p.requires_grad]
    layout = plan_layout([(str(i), p.dtype, p.numel()) for i, p in enumerate(params)], world_size=1,
                         bucket_elements=bucket_elements(25, torch.float32), grad_dtype=torch.float32)  # fmt: skip
    plans = []
    for bucket, spec in enumerate(layout.buckets):
        runs, cuts, spans, stages = [], [], [], []
        for piece in sorted(layout.pieces(bucket, 0), key=lambda piece: piece.shard_start):
            start, end, row = piece.shard_start, piece.shard_start + piece.numel, int(piece.slot % 7 == 3)
            if runs and runs[-1][1] == start and runs[-1][2] == row:
                runs[-1] = (runs[-1][0], end, row)
            else:
                runs.append((start, end, row))
            stages.append((start, end, piece.slot % 37))
            param = params[piece.slot]
            if param.dim() == 3:
                size = param.numel() // param.shape[0]
                for at in range(piece.param_start - piece.param_start % size, piece.param_end, size):
                    s = start + max(at, piece.param_start) - piece.param_start
                    e = start + min(at + size, piece.param_end) - piece.param_start
                    cuts += [s, e]
                    spans.append((s, e, 1 + len(spans)))
        first, last = spec.shard_range(0, 1)
        plans.append(
            {"runs": runs, "length": last - first, "cuts": cuts, "spans": sorted(spans), "stages": stages}
        )
    return plans


def test_n16_sized_plans_equal_the_reference() -> None:
    plans = n16_bucket_plans()
    assert sum(r[1] - r[0] for plan in plans for r in plan["runs"]) > 1.6e9  # n1.6-3b's trainable elements
    # the reference is slow: every bucket with tracked rows, and every tenth of the rest
    checked = [plan for i, plan in enumerate(plans) if plan["spans"] or i % 10 == 0]
    assert any(plan["spans"] for plan in checked)
    for plan in checked:
        table, align = block_table(plan["runs"], plan["length"], BLOCK, ALIGN, plan["cuts"])
        blocks, expected_align = reference.plan_blocks(plan["runs"], plan["length"], cuts=plan["cuts"])
        assert align == expected_align == ALIGN and as_tuples(table) == blocks
        index = flag_index(table[:, 0], plan["spans"])
        assert index.tolist() == reference.idle_index(blocks, plan["spans"])
        flat = {
            "blocks": torch.from_numpy(table),
            "master": torch.zeros(1),
            "idle_index": torch.from_numpy(index),
        }
        got, want = (
            split_by_stage(flat, plan["stages"], 37),
            reference.split_by_stage(flat, plan["stages"], 37),
        )
        assert [part is None for part in got] == [part is None for part in want]
        for a, b in zip(got, want):
            if a is not None:
                assert a["runs"] == b["runs"] and torch.equal(a["blocks"], b["blocks"])
                assert torch.equal(a["idle_index"], b["idle_index"])
