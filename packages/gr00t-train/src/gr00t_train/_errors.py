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
    """The loss became NaN or infinite; carries the step and the episode ids of the offending batch.

    Each rank says what it knows: the samples of its batch that hold NaN/inf (`bad_samples`), or that every
    input was finite (`inputs_finite`: the model diverged), or, when its own loss was finite and only the
    average over ranks was not, which ranks had the non-finite loss (`bad_ranks`)."""

    def __init__(
        self,
        step: int,
        value: float,
        episode_ids: list[int] | None,
        rank: int = 0,
        bad_samples: str | None = None,
        *,
        inputs_finite: bool = False,
        bad_ranks: list[int] | None = None,
    ) -> None:
        self.step = step
        self.value = value
        self.episode_ids = episode_ids
        self.rank = rank
        self.bad_samples = bad_samples
        self.bad_ranks = bad_ranks
        head = f"loss is {value} at step {step} (rank {rank})"
        if bad_ranks is not None and rank not in bad_ranks:
            ranks = ", ".join(str(r) for r in bad_ranks) or "unknown"
            super().__init__(
                f"{head}, averaged over ranks; this rank's own loss was finite: the non-finite loss was on "
                f"rank {ranks}, whose message names the batch"
            )
            return
        where = (
            f"episode ids {episode_ids}"
            if episode_ids
            else "episode ids unknown (batch has no episode_index)"
        )
        if bad_samples:  # the samples that carry the NaN/inf, by episode and frame
            hint = f"{bad_samples}. Fix or drop those frames (`vla-io check` lists them)."
        elif inputs_finite:
            hint = "Every input of that batch is finite: the model diverged; lower optim.lr (or optim.grad_clip)."
        else:
            hint = "Check those episodes for NaN/inf state or action values, or lower optim.lr."
        super().__init__(f"{head}; the batch came from {where}. {hint}")


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


class RunFolderError(ConfigError):
    """The output or checkpoint folder is in use by another live run, or holds another run's files."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (disk full, permissions) or none can be resumed from; the message
    names the folder or file and the reason."""


class PeerLostError(RuntimeError):
    """Another process of a multi-process run died or stopped answering: the message names its rank and the
    newest intact checkpoint to resume from (this process cannot write a new one without it). `speaks` is
    False on all but one surviving rank of each node, so a node prints the line once."""

    def __init__(self, message: str, speaks: bool = True) -> None:
        self.speaks = speaks
        super().__init__(message)


class LaunchError(RuntimeError):
    """`gr00t-train launch` could not start or finish the job (a node missing at the rendezvous, a worker
    that failed); `exit_code` is the command's exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class NonFiniteWeightsError(FloatingPointError):
    """The model's weights became NaN or infinite: no checkpoint is written from them."""


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped training after a checkpoint was saved (`checkpoint` is None when there was
    nothing new to save)."""

    def __init__(self, signal_name: str, step: int, checkpoint: str | None) -> None:
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint
        saved = f"saved checkpoint {checkpoint}" if checkpoint else "no new step to save"
        super().__init__(f"{signal_name} at step {step}: {saved}; continue with --resume")
