"""Every number a recipe holds has a sane range: a slip (steps: 10**15, lr: inf) is refused with the field's name."""

import re

import pytest

from training.recipe import RecipeError, validate


def _recipe(**changes):
    recipe = {"model": {"config": {"model_type": "qwen3_moe"}}, "phases": [{"kind": "cpt", "data": "x.jsonl",
                                                                           "steps": 10}]}
    for key, value in changes.items():
        if key.startswith("phase_"):
            recipe["phases"][0][key[len("phase_"):]] = value
        else:
            recipe[key] = value
    return recipe


@pytest.mark.parametrize("changes, words", [
    ({"phase_steps": 10**15}, "phases[0] (cpt).steps: at most 10,000,000"),
    ({"phase_steps": 2**31}, "phases[0] (cpt).steps: at most"),
    ({"seq_len": 10**11}, "seq_len: at most 1,048,576"),
    ({"batch_size": 10**6}, "batch_size: at most 4,096"),
    ({"lr": float("inf")}, "lr: must be a number > 0, got inf"),
    ({"lr": float("nan")}, "lr: must be a number > 0, got nan"),
    ({"lr": 5.0}, "lr: at most 1"),
    ({"phase_lr": 1e308}, "phases[0] (cpt).lr: at most 1"),
])
def test_it_refuses_numbers_out_of_range_with_the_fields_name(changes, words):
    with pytest.raises(RecipeError, match=re.escape(words)):
        validate(_recipe(**changes), data_on_disk=False)


def test_numbers_in_range_pass():
    validate(_recipe(phase_steps=10_000_000, seq_len=1_048_576, lr=1.0), data_on_disk=False)


def _phase(kind, **fields):
    return {"model": {"config": {"model_type": "qwen3_moe"}},
            "phases": [{"kind": kind, "data": "x.jsonl", "steps": 10, **fields}]}


@pytest.mark.parametrize("recipe, words", [
    # Each of these launched, then failed on the box when its phase started, after the phases before it.
    (_phase("kto", desirable_weight="abc"), "phases[0] (kto).desirable_weight: must be a number > 0, got 'abc'"),
    (_phase("kto", undesirable_weight=-5), "phases[0] (kto).undesirable_weight: must be a number > 0"),
    (_phase("grpo", reward="training.examples.rewards:no_such_function"),
     "training.examples.rewards has no function no_such_function"),
    (_phase("grpo", reward="training.no_such_module:f"), "training.no_such_module cannot be imported"),
    (_phase("grpo", reward="os:system"), "a function of a module under training"),
    (_phase("cpt", name="n" * 41), "phases[0].name: 1-40 letters"),
    (_phase("cpt", name=[1]), "phases[0].name: 1-40 letters"),
    ({**_phase("cpt"), "seq_len": 1}, "seq_len: at least 16 tokens, got 1"),
    ({**_phase("cpt"), "model": {"config": {"model_type": "qwen3_moe"}, "tokenizer": 5}}, "model.tokenizer: a folder"),
])
def test_it_refuses_at_launch_what_would_fail_on_the_box(recipe, words):
    with pytest.raises(RecipeError, match=re.escape(words)):
        validate(recipe, data_on_disk=False)


def test_a_hub_tokenizer_stays_a_hub_id(tmp_path):
    recipe = validate({**_phase("cpt"), "model": {"config": {"model_type": "qwen3_moe"},
                                                  "tokenizer": "Qwen/Qwen3-30B-A3B"}}, base_dir=tmp_path,
                      data_on_disk=False)
    assert recipe["model"]["tokenizer"] == "Qwen/Qwen3-30B-A3B"
    (tmp_path / "tok").mkdir()
    recipe = validate({**_phase("cpt"), "model": {"config": {"model_type": "qwen3_moe"}, "tokenizer": "tok"}},
                      base_dir=tmp_path, data_on_disk=False)
    assert recipe["model"]["tokenizer"] == str(tmp_path / "tok")


def test_a_reward_of_the_workers_own_package_passes():
    validate(_phase("grpo", reward="training.examples.rewards:answer_characters"), data_on_disk=False)
