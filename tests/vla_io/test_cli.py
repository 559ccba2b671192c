"""The `vla-io` command line."""

from __future__ import annotations

import subprocess
import sys

from vla_io import LeRobotDataset
from vla_io.cli import main
from vla_io.decode.frame_cache import default_dir


def test_synth_then_info_then_cache(tmp_path, capsys):
    root = tmp_path / "demo"
    args = [
        "synth",
        str(root),
        "--preset",
        "libero",
        "--episodes",
        "2",
        "--length",
        "8",
        "--image-size",
        "64",
    ]
    assert main([*args, "--version", "v3.0", "--codec", "h264"]) == 0
    ds = LeRobotDataset(root, progress=False)
    assert ds.meta.version == "v3.0" and ds.num_episodes == 2 and ds[0]["observation.state"].shape == (8,)
    assert main(["info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "LeRobot v3.0" in out and "observation.images.wrist_image" in out and "eef_pos[0:3]" in out
    assert "`vla-io check` decodes every frame" in out and "files present=1/1" in out  # info does not decode
    assert main(["cache", str(root), "--size", "32", "32"]) == 0
    assert (default_dir(ds, (32, 32)) / "manifest.json").exists() and not list(root.rglob("manifest.json"))


def test_errors_exit_nonzero_with_a_message(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 2
    assert "info.json: file not found" in capsys.readouterr().err


def test_module_entry_point(gr1_root):
    done = subprocess.run(
        [sys.executable, "-m", "vla_io", "info", str(gr1_root)], capture_output=True, text=True, check=True
    )
    assert "LeRobot v2.0" in done.stdout and "ignored unless asked for" in done.stdout
