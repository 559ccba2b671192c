"""Errors the trainer raises: each names what went wrong and what to change."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; `field` is its dotted name (for example `optim.lr`)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}" if field else message)

    def within(self, section: str) -> ConfigError:
        """The same error, with the field name prefixed by the enclosing section."""
        return ConfigError(f"{section}.{self.field}" if self.field else section, self.reason)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; carries the step and the episode ids of the offending batch."""

    def __init__(self, step: int, value: float, episode_ids: list[int] | None, rank: int = 0) -> None:
        self.step = step
        self.value = value
        self.episode_ids = episode_ids
        self.rank = rank
        where = (
            f"episode ids {episode_ids}"
            if episode_ids
            else "episode ids unknown (batch has no episode_index)"
        )
        super().__init__(
            f"loss is {value} at step {step} (rank {rank}); the batch came from {where}. "
            "Check those episodes for NaN/inf state or action values, or lower optim.lr."
        )


class BatchTooLargeError(RuntimeError):
    """A training step ran out of device memory at the configured batch size."""

    def __init__(self, step: int, batch_size: int, grad_accum: int, device: str, detail: str) -> None:
        self.step = step
        self.batch_size = batch_size
        super().__init__(
            f"out of memory on {device} at step {step} with data.batch_size={batch_size} per device "
            f"(optim.grad_accum={grad_accum}). Lower data.batch_size and raise optim.grad_accum to keep the "
            f"same global batch. Original error: {detail}"
        )


class DataError(RuntimeError):
    """The dataset cannot be used as configured (missing files, statistics or cameras)."""
