"""from_pretrained builds the model's module tree once when the files provide every tensor: the meta-device
skeleton that lists the expected tensors becomes the model (allocated on the device, no random init), with
the same tensors as the saved model."""

from __future__ import annotations

import torch
from gr00t_model import GR00TN16, GR00TConfig, _model, from_pretrained, save_pretrained


def test_a_complete_checkpoint_builds_the_model_once(tmp_path, monkeypatch) -> None:
    model = GR00TN16(GR00TConfig.preset("tiny"))
    save_pretrained(model, tmp_path)
    built = []
    plain_init = _model.GR00TN16.__init__

    def counting_init(self, config) -> None:
        built.append(torch.empty(0).device.type)  # where the default device put tensors
        plain_init(self, config)

    monkeypatch.setattr(_model.GR00TN16, "__init__", counting_init)
    loaded, report = from_pretrained(tmp_path, return_report=True)
    assert built == ["meta"] and report.missing == []
    saved, got = model.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys()
    assert all(got[k].device.type == "cpu" and torch.equal(got[k], saved[k]) for k in saved)
