"""Data sources shared by the gr00t_train tests that train the real (demo) GR00T model on CPU (tests/ is on
the import path: pyproject.toml's pythonpath)."""

from __future__ import annotations

import gr00t_model
import torch


class DummySource:
    """Processor-shaped batches from gr00t_model.make_dummy_batch, a fixed cycle of 4."""

    def __init__(self, config, batch_size):
        self.batches = [
            gr00t_model.make_dummy_batch(config, batch_size, num_images=2, seed=i) for i in range(4)
        ]
        self.position = 0

    def __next__(self):
        batch = dict(self.batches[self.position % 4])
        batch["episode_index"] = torch.full((batch["state"].shape[0],), self.position)
        self.position += 1
        return batch

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]

    def timings(self):
        return {}

    def close(self):
        pass
