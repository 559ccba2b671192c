"""Checks of the folders a run will write, made before it writes anything: never inside its dataset,
writable now (not at the first save), and not above or below a folder another live run holds."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from .._errors import ConfigError, RunFolderError
from ..config.sections import TrainConfig
from .lock import held_below, live_holder


def refuse_dataset_folder(cfg: TrainConfig, folders: list[tuple[Path, str]]) -> None:
    """A run never writes into the dataset it reads (the dataset may be shared, or read by other runs), nor
    into any dataset of its data.mixture."""
    datasets = [cfg.data.dataset] if cfg.data.dataset else [e.dataset for e in cfg.data.mixture or []]
    for given in datasets:
        dataset = Path(given).resolve()
        for folder, setting in folders:
            if folder.resolve().is_relative_to(dataset):
                raise ConfigError(
                    setting,
                    f"{folder} is inside the dataset folder {given}; a run never writes into its "
                    f"dataset. Choose an {setting} outside it",
                )


def probe_writable(folder: Path, setting: str) -> None:
    """Create and remove a file in `folder`: a read-only folder stops the run now, not at its first save."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gr00t-train-probe-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(err.errno, err.strerror, str(folder)) from None
        raise RunFolderError(
            setting,
            f"{folder} is not writable ({err.strerror}); make it writable or choose another {setting}",
        ) from None


def refuse_inside_live_run(folder: Path, setting: str) -> None:
    """Refuse a folder inside one another live run holds (cheap: its ancestors' lock files only)."""
    for above in folder.resolve().parents:
        holder = live_holder(above)
        if holder is not None:
            raise RunFolderError(
                setting,
                f"{folder} lies inside {above}, which another live run holds ({holder}); its files must "
                f"not be mixed with this run's. Choose another {setting}",
            )


def refuse_nested_runs(folder: Path, setting: str) -> None:
    """Refuse a folder inside, or containing, one another live run holds."""
    refuse_inside_live_run(folder, setting)
    below = held_below(folder.resolve())
    if below is not None:
        raise RunFolderError(
            setting,
            f"{folder} contains {below[0]}, which another live run holds ({below[1]}); this run would "
            f"write over or move its files. Choose another {setting}",
        )
