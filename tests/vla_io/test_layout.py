"""How vla-io is built: subpackages by job, each with its own public names; a cheap `import vla_io`; names
that left the top level in 0.3.0 still found there (with a warning) until 0.4.0; files under 400 lines."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import vla_io

SUBPACKAGES = {
    "dataset": [
        "DatasetMeta",
        "Episode",
        "LeRobotDataset",
        "MIXTURE_KEY",
        "MixtureDataset",
        "MixtureMember",
        "Modality",
        "ModalityEntry",
        "VideoSpan",
        "dataset_stats",
    ],
    "decode": [
        "CheckReport",
        "FrameCache",
        "VideoReader",
        "available_backends",
        "check_dataset",
        "open_reader",
    ],
    "pipeline": ["EpochSampler", "MixtureSampler", "Pipeline", "PipelineConfig", "collate"],
    "augment": ["ImageAugment", "ImageParams", "ImageTransformConfig", "sample_params"],
    "testing": [
        "SYNTH_PRESETS",
        "SynthConfig",
        "VideoWriter",
        "read_frame_marker",
        "write_synthetic_dataset",
    ],
}
MOVED = {
    "Episode": "dataset",
    "VideoSpan": "dataset",
    "Modality": "dataset",
    "ModalityEntry": "dataset",
    "FrameCache": "decode",
    "ImageParams": "augment",
    "sample_params": "augment",
    "SynthConfig": "testing",
    "SYNTH_PRESETS": "testing",
    "read_frame_marker": "testing",
}
SOURCE = Path(vla_io.__file__).parent


def _all_modules() -> list[str]:
    return [
        m.name for m in pkgutil.walk_packages(vla_io.__path__, "vla_io.") if not m.name.endswith("__main__")
    ]


@pytest.mark.parametrize("name", sorted(SUBPACKAGES))
def test_each_subpackage_exports_its_public_names(name: str) -> None:
    package = importlib.import_module(f"vla_io.{name}")
    assert sorted(package.__all__) == SUBPACKAGES[name]
    for module in _all_modules():  # a submodule imported later must not shadow an exported name
        importlib.import_module(module)
    for export in package.__all__:
        value = getattr(package, export)
        assert not isinstance(value, types.ModuleType), f"vla_io.{name}.{export} is a module"
        assert export in dir(package)


def test_top_level_names_are_the_subpackages_objects() -> None:
    for name in sorted(SUBPACKAGES):
        package = importlib.import_module(f"vla_io.{name}")
        for export in set(package.__all__) & set(vla_io.__all__):
            assert getattr(vla_io, export) is getattr(package, export)
    assert vla_io.testing is importlib.import_module("vla_io.testing")  # subpackages load on access


@pytest.mark.parametrize("name", sorted(MOVED))
def test_moved_names_still_resolve_with_a_deprecation_warning(name: str) -> None:
    assert name not in vla_io.__all__ and name not in dir(vla_io)
    home = importlib.import_module(f"vla_io.{MOVED[name]}")
    with pytest.warns(DeprecationWarning, match=rf"vla_io\.{name} moved to vla_io\.{MOVED[name]}\.{name}"):
        value = getattr(vla_io, name)
    assert value is getattr(home, name)


def test_unknown_names_raise_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(vla_io, "no_such_name")
        assert not hasattr(vla_io.pipeline, "no_such_name")


def test_importing_vla_io_and_its_subpackages_is_cheap() -> None:
    code = (
        "import sys, vla_io, vla_io.dataset, vla_io.decode, vla_io.pipeline, vla_io.augment, vla_io.testing\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pyarrow', 'av') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_file_stays_under_400_lines() -> None:
    long = {
        str(path.relative_to(SOURCE)): n
        for path in SOURCE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) >= 400
    }
    assert not long, f"split these modules (400 lines at most): {long}"


def test_the_three_levels_show_in_the_pipeline_file_names() -> None:
    names = {p.stem for p in (SOURCE / "pipeline").glob("level*.py")}
    assert names == {"level1_workers", "level2_host", "level3_device"}
