"""Embodiment tags and the projector slot each one selects in the per-embodiment encoders and decoder."""

from __future__ import annotations

from types import MappingProxyType

# Public slots of the release (reference section 3). Pretraining-only slots are not published.
EMBODIMENT_TAGS = MappingProxyType(
    {
        "oxe_google": 0,
        "oxe_widowx": 1,
        "libero_panda": 2,
        "unitree_g1": 8,
        "new_embodiment": 10,
        "robocasa_panda_omron": 13,
        "oxe_droid": 16,
        "gr1": 20,
        "behavior_r1_pro": 24,
    }
)


def embodiment_id(tag: str | int, max_num_embodiments: int = 32) -> int:
    """Slot index of an embodiment tag (an int is taken as the slot itself)."""
    if isinstance(tag, int):
        slot = tag
    elif tag in EMBODIMENT_TAGS:
        slot = EMBODIMENT_TAGS[tag]
    else:
        raise ValueError(
            f"unknown embodiment tag {tag!r}; known tags: {sorted(EMBODIMENT_TAGS)} (or pass a slot int)"
        )
    if not 0 <= slot < max_num_embodiments:
        raise ValueError(f"embodiment slot {slot} (tag {tag!r}) outside [0, {max_num_embodiments})")
    return slot
