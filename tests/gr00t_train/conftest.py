"""Fixtures of the gr00t_train tests: the stand-in module, a one-rank process group."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

STANDINS = Path(__file__).with_name("standins.py")


def load_standins():
    """The stand-ins module (importable from subprocesses the same way)."""
    name = "gr00t_train_standins"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, STANDINS)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def standins():
    return load_standins()


@pytest.fixture(scope="module")
def env():
    """A one-rank gloo process group on CPU, shared by a test module."""
    import gr00t_train

    torch.set_num_threads(1)
    env = gr00t_train.init_distributed("cpu")
    yield env
    gr00t_train.shutdown_distributed(env)
