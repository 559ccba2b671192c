"""gr00t-model: the GR00T N1.6 model, its processor, FLOP counter and checkpoint loading (see the README).

`import gr00t_model` stays cheap: torch and transformers load on first use of a name that needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .__about__ import __version__
from ._config import GR00TConfig
from ._embodiment import EMBODIMENT_TAGS

_LAZY = {
    "GR00TN16": "._model",
    "GR00TProcessor": "._processor",
    "ProcessorConfig": "._processor",
    "EmbodimentSpec": "._normalize",
    "JointGroup": "._normalize",
    "relative_action_stats": "._normalize",
    "ImageSpec": "._images",
    "preprocess_images": "._images",
    "count_parameters": "._flops",
    "training_flops_per_sample": "._flops",
    "from_pretrained": "._checkpoint",
    "save_pretrained": "._checkpoint",
    "LoadReport": "._checkpoint",
    "load_tokenizer": "._tokenizer",
    "make_dummy_batch": "._dummy",
    "DEFAULT_LORA_TARGETS": "._lora",
    "LoRALinear": "._lora",
    "add_lora": "._lora",
    "load_lora": "._lora",
    "lora_state_dict": "._lora",
    "merge_lora": "._lora",
    "save_lora": "._lora",
}

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "EMBODIMENT_TAGS",
    "EmbodimentSpec",
    "GR00TConfig",
    "GR00TN16",
    "GR00TProcessor",
    "ImageSpec",
    "JointGroup",
    "LoRALinear",
    "LoadReport",
    "ProcessorConfig",
    "__version__",
    "add_lora",
    "count_parameters",
    "from_pretrained",
    "load_lora",
    "load_tokenizer",
    "lora_state_dict",
    "make_dummy_batch",
    "merge_lora",
    "preprocess_images",
    "relative_action_stats",
    "save_lora",
    "save_pretrained",
    "training_flops_per_sample",
]

if TYPE_CHECKING:
    from ._checkpoint import LoadReport, from_pretrained, save_pretrained
    from ._dummy import make_dummy_batch
    from ._flops import count_parameters, training_flops_per_sample
    from ._images import ImageSpec, preprocess_images
    from ._lora import (
        DEFAULT_LORA_TARGETS,
        LoRALinear,
        add_lora,
        load_lora,
        lora_state_dict,
        merge_lora,
        save_lora,
    )
    from ._model import GR00TN16
    from ._normalize import EmbodimentSpec, JointGroup, relative_action_stats
    from ._processor import GR00TProcessor, ProcessorConfig
    from ._tokenizer import load_tokenizer


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gr00t_model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
