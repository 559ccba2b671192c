"""data.mixture as a setting: TOML/YAML/--set syntax, and refusals that name the field or the entry, before
any heavy work."""

from __future__ import annotations

import json

import gr00t_train
import pytest
from gr00t_train import ConfigError, DataError
from gr00t_train.config.io import config_from_dict, config_to_dict
from gr00t_train.data.mixture_data import plan_mixture

TOML = """
preset = "demo"

[data]
cameras = "none"
embodiment_tag = "new_embodiment"

[[data.mixture]]
dataset = "{a}"
weight = 3
embodiment_tag = "libero_panda"

[[data.mixture]]
dataset = "{b}"
weight = 1
embodiment_tag = "gr1"
cameras = ["wrist_image", "image"]
name = "humanoid"
"""


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    import vla_io

    base = vla_io.testing.SynthConfig(episodes=2, episode_length=8, image_size=64, codec="h264")
    folder = tmp_path_factory.mktemp("mixture")
    a = vla_io.write_synthetic_dataset(folder / "a", base, progress=False)
    b = vla_io.write_synthetic_dataset(folder / "b", base.with_(state_dim=12, action_dim=10), progress=False)
    return a, b


def _load(tmp_path, text: str, *sets: str, suffix: str = ".toml"):
    path = tmp_path / f"mix{suffix}"
    path.write_text(text)
    return gr00t_train.load_config(path, overrides=list(sets))


def test_toml_yaml_and_set_give_the_same_entries(tmp_path, roots) -> None:
    a, b = roots
    cfg = _load(tmp_path, TOML.format(a=a, b=b))
    entries = cfg.data.mixture
    assert [(e.dataset, e.weight, e.embodiment_tag, e.label) for e in entries] == [
        (str(a), 3.0, "libero_panda", "a"),
        (str(b), 1.0, "gr1", "humanoid"),
    ]
    assert entries[1].cameras == ["wrist_image", "image"]
    yaml = f"""preset: demo
data:
  cameras: null
  embodiment_tag: new_embodiment
  mixture:
    - {{dataset: {a}, weight: 3, embodiment_tag: libero_panda}}
    - {{dataset: {b}, weight: 1, embodiment_tag: gr1, cameras: [wrist_image, image], name: humanoid}}
"""
    assert _load(tmp_path, yaml, suffix=".yaml").data.mixture == entries
    entry = json.dumps({"dataset": str(a), "weight": 3, "embodiment_tag": "libero_panda"})
    other = json.dumps(
        {
            "dataset": str(b),
            "weight": 1,
            "embodiment_tag": "gr1",
            "cameras": ["wrist_image", "image"],
            "name": "humanoid",
        }
    )
    sets = ["data.cameras=none", "data.embodiment_tag=new_embodiment", f"data.mixture=[{entry}, {other}]"]
    assert gr00t_train.load_config(preset="demo", overrides=sets).data.mixture == entries
    # the resolved config (train_config.json) reads back to the same entries
    assert config_from_dict(type(cfg), config_to_dict(cfg)).data.mixture == entries


@pytest.mark.parametrize(
    ("sets", "field", "words"),
    [
        (["data.dataset=/somewhere"], "data.dataset", "must be unset with data.mixture"),
        (["data.cameras=image"], "data.cameras", "must be unset with data.mixture"),
        (["data.embodiment_tag=gr1"], "data.embodiment_tag", "must be unset with data.mixture"),
        (["data.state_keys=state"], "data.state_keys", "must be unset with data.mixture"),
    ],
)
def test_single_dataset_keys_are_refused_beside_a_mixture(tmp_path, roots, sets, field, words) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        _load(tmp_path, TOML.format(a=roots[0], b=roots[1]), *sets)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("entries", "field", "words"),
    [
        (
            '[{"dataset": "/a", "weight": 1}, {"dataset": "/b"}]',
            "data.mixture[1].weight",
            "every entry a weight",
        ),
        ('[{"dataset": "/a", "weight": 0}]', "data.mixture[0].weight", "must be > 0"),
        ('[{"dataset": "/a", "wieght": 1}]', "data.mixture[0].wieght", "unknown setting"),
        ('[{"weight": 1}]', "data.mixture[0].dataset", "must name a LeRobot dataset"),
        ('[{"dataset": "/x/a"}, {"dataset": "/y/a"}]', "data.mixture", "two entries are called a"),
        ("[]", "data.mixture", "at least one dataset"),
    ],
)
def test_bad_entries_name_the_entry_and_field(entries, field, words) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        gr00t_train.load_config(overrides=[f"data.mixture={entries}"])
    assert caught.value.field == field


def test_members_are_checked_on_metadata_naming_the_entry(tmp_path, roots) -> None:
    a, b = roots
    cfg = _load(tmp_path, TOML.format(a=a, b=b))
    plans = plan_mixture(cfg)
    assert [p.cfg.data.dataset for p in plans] == [str(a), str(b)]
    assert plans[1].cfg.data.embodiment_tag == "gr1" and plans[1].cfg.data.mixture is None
    with pytest.raises(DataError, match=r"data\.mixture\[1\] \(humanoid\): .*data\.mixture\[1\]\.dataset"):
        plan_mixture(_load(tmp_path, TOML.format(a=a, b=tmp_path / "missing")))
    one_camera = TOML.format(a=a, b=b).replace('["wrist_image", "image"]', '["image"]')
    with pytest.raises(ConfigError, match=r"as many cameras \(data.mixture\[0\] \(a\): 2, .*humanoid\): 1\)"):
        plan_mixture(_load(tmp_path, one_camera))
    with pytest.raises(ConfigError, match="is not one of the allowed values") as caught:
        plan_mixture(_load(tmp_path, TOML.format(a=a, b=b).replace('"gr1"', '"robot_x"')))
    assert caught.value.field == "data.mixture[1].embodiment_tag"
    for sets, field in [
        (["data.decode_device=cuda"], "data.decode_device"),
        (["optimizations.data=dataloader"], "optimizations.data"),
        (["data.prefix_cache.mode=memory"], "data.prefix_cache.mode"),
    ]:
        with pytest.raises(ConfigError) as caught:
            plan_mixture(_load(tmp_path, TOML.format(a=a, b=b), *sets))
        assert caught.value.field == field


def test_the_readme_example_is_a_valid_config(tmp_path) -> None:
    """The TOML of the gr00t-train README's Mixtures section loads as written (paths are read later)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "packages" / "gr00t-train" / "README.md").read_text()
    section = readme[readme.index("## Mixtures") :]
    (example,) = re.findall(r"^```toml\n(.*?)^```", section[: section.index("\n## ")], re.S | re.M)
    cfg = _load(tmp_path, example)
    assert [(e.label, e.weight, e.embodiment_tag) for e in cfg.data.mixture] == [
        ("libero_spatial", 2.0, "libero_panda"),
        ("libero_object", 1.0, "libero_panda"),
        ("gr1", 1.0, "gr1"),
    ]
    assert cfg.data.mixture[2].state_keys == ["left_arm", "right_arm", "left_hand", "right_hand"]


def test_a_run_never_writes_into_a_mixture_member(tmp_path, roots) -> None:
    from gr00t_train.run_folder.checks import refuse_dataset_folder

    cfg = _load(tmp_path, TOML.format(a=roots[0], b=roots[1]))
    refuse_dataset_folder(cfg, [(tmp_path / "out", "output_dir")])
    with pytest.raises(ConfigError, match="inside the dataset folder") as caught:
        refuse_dataset_folder(cfg, [(roots[1] / "run", "output_dir")])
    assert caught.value.field == "output_dir"
