"""A logging window is read while the next step runs: a plain flush issues its copies, the next step logs it;
a save, a validation and the last step log at once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _torchrun import torchrun
from gr00t_train import NonFiniteLossError, Trainer

STANDINS = Path(__file__).with_name("standins.py")


def _logged_steps(run) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_window_is_logged_after_the_next_step_and_a_save_logs_at_once(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=8, logging__every=2, checkpoint__every=6)
    trainer = Trainer(cfg, standins.make_parts(), env)
    seen: dict[int, list[int]] = {}
    trainer.step_callback = lambda: seen.setdefault(trainer.step, _logged_steps(tmp_path / "run"))
    trainer.fit()
    # the callback runs after a step's launch (and the last window's logging), before that step's flush
    assert seen == {
        1: [], 2: [], 3: [1, 2], 4: [1, 2], 5: [1, 2, 3, 4], 6: [1, 2, 3, 4],
        7: [1, 2, 3, 4, 5, 6],  # step 6's save logged its window before writing the checkpoint
        8: [1, 2, 3, 4, 5, 6],
    }  # fmt: skip
    assert _logged_steps(tmp_path / "run") == list(range(1, 9))  # the last step logs at once, each step once
    laps = json.loads((tmp_path / "run" / "summary.json").read_text())["session_parts_s"]
    assert {"flush_issue", "flush_device_sync", "flush_records", "flush_log"} <= set(laps)


def test_a_nan_in_a_window_read_late_stops_the_next_step_naming_its_own(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=12, logging__every=2)
    parts = standins.make_parts(batch_size=4, nan_at=1)  # the 2nd batch holds a NaN; step 2 flushes
    trainer = Trainer(cfg, parts, env)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit()
    assert info.value.step == 2 and trainer.step == 3  # found once step 3 was launched
    assert _logged_steps(tmp_path / "run") == []  # nothing of the broken window is written


_NAN_WORKER = """
import importlib.util, json, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
cfg = standins.small_config(Path({tmp!r}), steps=6, logging__every=2, optimizations__comm="zero1_overlap")
trainer = gr00t_train.Trainer(cfg, standins.make_parts(rank=env.rank, nan_at=1 if env.rank == 1 else None), env)
try:
    trainer.fit()
except gr00t_train.NonFiniteLossError as err:
    found = dict(step=err.step, bad_ranks=err.bad_ranks, bad_samples=err.bad_samples, at=trainer.step)
    Path({tmp!r}, f"error-rank{{env.rank}}.json").write_text(json.dumps(found))
gr00t_train.shutdown_distributed(env)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_name_the_rank_whose_loss_went_bad(tmp_path) -> None:
    # every rank logs the window at the same step (the next one), so the error path's all-reduce pairs up
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_NAN_WORKER.format(standins=str(STANDINS), tmp=str(tmp_path))))
    code, output = torchrun(str(script), timeout=120)
    assert code == 0, output[-5000:]
    first, second = (json.loads((tmp_path / f"error-rank{r}.json").read_text()) for r in (0, 1))
    assert first["step"] == second["step"] == 2 and first["bad_ranks"] == second["bad_ranks"] == [1]
    assert first["bad_samples"] is None  # rank 0's batch was fine: rank 1 names the sample
    assert second["bad_samples"].startswith("Sample 0 of microbatch 0 (episode ")
