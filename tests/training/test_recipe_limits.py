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
