"""The typed recipe states the defaults once: `validate` fills a recipe in with exactly them, `RunRecipe.from_dict`
reads that dict back as typed values, and `RunRecipe.from_stored` reads a stored (possibly partial) recipe leniently
with the same defaults."""

import dataclasses
from pathlib import Path

import pytest

import training
from training.recipe import (DEFAULTS, MODEL_DEFAULTS, PHASE_DEFAULTS, CheckpointSettings, LoraSettings,
                             ModelSettings, PhaseSpec, RunRecipe, load_recipe, validate)

EXAMPLES = Path(training.__file__).resolve().parent / "examples"
CONFIG = {"model_type": "qwen3_moe"}


def _minimal(**changes) -> dict:
    return {"model": {"config": CONFIG}, "phases": [{"kind": "cpt", "data": "x.jsonl", "steps": 10}], **changes}


def test_the_defaults_validate_fills_in_are_the_dataclasses():
    filled = validate(_minimal(), data_on_disk=False)
    typed = RunRecipe.from_dict(filled)
    assert typed == RunRecipe(model=ModelSettings(config=CONFIG), phases=typed.phases)
    assert typed.lora == LoraSettings() and typed.checkpoint.keep == CheckpointSettings().keep == 3
    assert (typed.batch_size, typed.grad_accum, typed.seq_len, typed.gpus, typed.lora.r) == (2, 8, 2048, 1, 32)
    assert typed.phases == (PhaseSpec(kind="cpt", data="x.jsonl", steps=10, name="cpt", checkpoint_every=50,
                                      lr=2.0e-4),)


def test_the_derived_dicts_hold_todays_values():
    assert DEFAULTS["lora"] == {"r": 32, "alpha": 64, "attention": True, "targets": None}
    assert DEFAULTS["checkpoint"] == {"store": "checkpoints", "endpoint_url": None, "region": None, "keep": 3,
                                      "every": 50, "staging": "checkpoint-staging"}
    assert MODEL_DEFAULTS == {"dtype": "bfloat16", "seed": 0, "tokenizer": None, "revision": None}
    held_out = {"eval_data": None, "eval_split": 0.0, "eval_every": 0}  # every training kind's
    assert PHASE_DEFAULTS == {"cpt": held_out, "sft": held_out, "dpo": {"beta": 0.1, **held_out},
                              "kto": {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0, **held_out},
                              "grpo": {"num_generations": 4, "max_new_tokens": 64, "temperature": 1.0, **held_out},
                              "eval": {"scorer": "exact", "max_new_tokens": 256, "max_samples": 0,
                                       "time_limit_s": 3600, "batch_size": 8}}


def test_a_loaded_recipe_reads_back_as_typed_values_and_round_trips():
    filled = load_recipe(EXAMPLES / "tiny.yaml")
    typed = RunRecipe.from_dict(filled)
    assert typed.to_dict() == filled
    assert typed.lora.r == 4 and typed.model.dtype == "float32" and typed.checkpoint.every == 2
    assert [p.kind for p in typed.phases] == ["cpt", "sft", "dpo", "kto", "grpo"]
    grpo = typed.phases[-1]
    assert (grpo.num_generations, grpo.max_new_tokens, grpo.temperature) == (4, 8, 1.0)
    assert typed.phases[2].beta == 0.1 and typed.phases[0].checkpoint_every == 2


def test_a_stored_recipe_is_read_with_the_same_defaults():
    stored = _minimal()
    assert RunRecipe.from_stored(stored) == RunRecipe.from_dict(validate(stored, data_on_disk=False))


def test_a_stored_recipe_keeps_what_it_states():
    stored = _minimal(batch_size=4, seq_len=4096, gpus=2, grad_accum=1, lora={"r": 64}, checkpoint={"keep": 5},
                      lr=1e-3, phases=[{"kind": "dpo", "data": "d", "steps": 3, "name": "pref", "beta": 0.2}])
    typed = RunRecipe.from_stored(stored)
    assert (typed.batch_size, typed.seq_len, typed.gpus, typed.grad_accum) == (4, 4096, 2, 1)
    assert typed.lora == LoraSettings(r=64) and typed.checkpoint == CheckpointSettings(keep=5)
    assert typed.phases == (PhaseSpec(kind="dpo", data="d", steps=3, name="pref", checkpoint_every=50, lr=1e-3,
                                      beta=0.2),)


@pytest.mark.parametrize("stored", [
    None, [], {}, {"batch_size": "2"}, {"batch_size": True}, {"batch_size": 0}, {"lora": 32}, {"lora": {"r": None}},
    {"checkpoint": {"keep": -1}}, {"gpus": 1.5}, {"model": "Qwen/Qwen3-30B-A3B"}, {"lr": float("nan")},
])
def test_a_partial_or_odd_stored_recipe_reads_as_the_defaults(stored):
    assert RunRecipe.from_stored(stored) == RunRecipe(model=ModelSettings(), phases=())


def test_a_stored_phase_that_cannot_be_read_is_left_out():
    stored = _minimal(phases=[{"kind": "cpt", "data": "a", "steps": 2}, {"kind": "nope", "data": "b", "steps": 2},
                              {"kind": "sft", "steps": 2}, {"kind": "sft", "data": "c", "steps": 0}, "sft"])
    assert [p.data for p in RunRecipe.from_stored(stored).phases] == ["a"]


def test_it_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunRecipe(model=ModelSettings(), phases=()).batch_size = 4  # type: ignore[misc]
