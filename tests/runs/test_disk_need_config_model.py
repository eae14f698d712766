"""A model built from its config on the box (random weights) is sized from that config: the tiny example's box needs
the image and headroom and checkpoints of a few MB, not the 30B profile's 7.4 GB checkpoints (59 GB in all)."""

import pytest

from fleet.instances import disk
from runs.launch import demo_recipe, disk_need
from training.recipe import validate


def _tiny_config() -> dict:
    return dict(demo_recipe()["model"]["config"])


def test_the_tiny_examples_disk_need_is_the_image_and_headroom_and_tiny_checkpoints():
    need = disk_need(validate(demo_recipe(), base_dir="/", data_on_disk=False))
    assert need.weights_gb == 0 and need.checkpoint_gb < 0.1
    assert need.total_gb <= need.image_gb + disk.HEADROOM_MIN_GB + 1
    assert "7.4 GB" not in str(need)


def test_a_built_models_size_is_its_configs_parameter_count():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = _tiny_config()
    model_type = config.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **config))
    actual = sum(p.numel() for p in model.parameters())
    assert abs(disk.config_parameters(_tiny_config()) - actual) <= 0.01 * actual


def test_a_config_without_its_shapes_falls_back_to_the_profiles_figures():
    assert disk.config_parameters({"model_type": "qwen3_moe"}) is None
