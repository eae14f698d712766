"""An eval phase in a recipe, its records and the recipe's `promote:` rule: what is filled in, and every mistake
refused with the reason at launch, not hours later on the box."""

import json
from pathlib import Path

import pytest

import training
from training.records import read_records, record_problems
from training.recipe import PROMOTE_DEFAULTS, RecipeError, RunRecipe, validate
from training.train import training_phases

MODEL = {"config": {"model_type": "qwen3_moe"}}
TRAIN = {"kind": "sft", "data": "sft.jsonl", "steps": 2}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def checked(*phases, **settings):
    return validate({"model": MODEL, "phases": list(phases), **settings}, data_on_disk=False)


def problems_of(*phases, **settings) -> str:
    with pytest.raises(RecipeError) as caught:
        checked(*phases, **settings)
    return str(caught.value)


def test_an_eval_phase_is_filled_in_with_its_defaults_and_no_steps():
    recipe = checked(TRAIN, {"kind": "eval", "data": "eval.jsonl"})
    phase = recipe["phases"][1]
    assert {key: phase[key] for key in ("kind", "name", "steps", "scorer", "max_new_tokens", "max_samples",
                                        "time_limit_s", "batch_size")} == {
        "kind": "eval", "name": "eval", "steps": 0, "scorer": "exact", "max_new_tokens": 256, "max_samples": 0,
        "time_limit_s": 3600, "batch_size": 8}
    assert recipe["promote"] is None
    assert RunRecipe.from_dict(recipe).to_dict()["phases"][1] == phase
    assert [p["kind"] for p in training_phases(recipe["phases"])] == ["sft"]


def test_a_stored_eval_phase_reads_back_as_stored():
    recipe = checked(TRAIN, {"kind": "eval", "data": "eval.jsonl", "scorer": "tool_call", "max_samples": 5},
                     promote={"min_gain": 0.1})
    stored = RunRecipe.from_stored(json.loads(json.dumps(recipe)))
    assert stored.phases[1].kind == "eval" and stored.phases[1].scorer == "tool_call"
    assert stored.phases[1].max_new_tokens == 256 and stored.phases[1].steps == 0
    assert stored.promote == {**PROMOTE_DEFAULTS, "min_gain": 0.1}


@pytest.mark.parametrize("phases, said", [
    ([{"kind": "eval", "data": "e.jsonl"}], "an eval phase comes after every training phase"),
    ([{"kind": "eval", "data": "e.jsonl"}, TRAIN], "an eval phase comes after every training phase"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl"}, {"kind": "eval", "data": "f.jsonl", "name": "again"}],
     "at most one eval phase"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "steps": 5}], "steps: not for an eval phase"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "lr": 0.1}], "lr: not for an eval phase"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "scorer": "fuzzy"}], "scorer: one of exact, contains, regex"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "scorer": "os:system"}], "a function of a module under training"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "scorer": "training.examples.rewards:nothing"}],
     "has no function nothing"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "time_limit_s": 0}], "time_limit_s: must be an integer >= 1"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "max_samples": -1}], "max_samples: must be an integer >= 0"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "batch_size": 0}], "batch_size: must be an integer >= 1"),
    ([TRAIN, {"kind": "eval", "data": "e.jsonl", "temperature": 0.5}], "unknown setting(s) temperature"),
    ([{**TRAIN, "scorer": "exact"}, {"kind": "eval", "data": "e.jsonl"}], "unknown setting(s) scorer for a sft"),
])
def test_an_eval_phase_out_of_place_or_mis_set_is_refused(phases, said):
    assert said in problems_of(*phases)


def test_a_scoring_function_of_the_package_is_taken():
    recipe = checked(TRAIN, {"kind": "eval", "data": "e.jsonl", "scorer": "training.examples.rewards:contains_answer"})
    assert recipe["phases"][1]["scorer"] == "training.examples.rewards:contains_answer"


@pytest.mark.parametrize("promote, said", [
    ({"metric": "loss"}, "promote.metric: one of ('adapter_score', 'difference')"),
    ({"min_gain": "a lot"}, "promote.min_gain: a number from -1 to 1"),
    ({"min_score": 1.5}, "promote.min_score: a number from 0 to 1"),
    ({"min_gain": True}, "promote.min_gain: a number"),
    ({"gain": 0.1}, "promote: unknown setting(s) gain"),
    ("yes", "promote: a mapping"),
])
def test_a_promote_rule_is_checked(promote, said):
    assert said in problems_of(TRAIN, {"kind": "eval", "data": "e.jsonl"}, promote=promote)


def test_a_promote_rule_needs_an_eval_phase():
    assert "promote: needs an eval phase" in problems_of(TRAIN, promote={"min_gain": 0.0})


def test_eval_records_are_checked_line_by_line(tmp_path):
    good = {"prompt": "2 + 2 =", "expected": "4"}
    tool = {"prompt": [{"role": "user", "content": "add 1 and 2"}], "tools": [ADD],
            "expected": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    assert record_problems("eval", good) == [] and record_problems("eval", tool) == []
    assert record_problems("eval", {"prompt": "p"}) == [
        "missing expected (the answer to score against), reference or tools (to check a call of)"]
    assert record_problems("eval", {"prompt": "", "expected": 4}) == [
        "prompt: empty", "expected: a text or a tool call {\"name\", \"arguments\"}, got int"]
    bad_schema = {**tool, "tools": [{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integr"}}}}}]}
    assert record_problems("eval", bad_schema)[0].startswith("tools[0].function.parameters: not a valid JSON schema")
    assert record_problems("eval", {**tool, "tools": [{"function": {"name": "add"}}, {"function": {"name": "add"}}]}) \
        [0] == "tools[1].function.name: 'add' is named twice"
    assert record_problems("eval", {**tool, "tools": [{"function": {"name": "a b"}}]})[0].startswith(
        "tools[0].function.name: 1-128 letters")
    assert record_problems("eval", {**tool, "expected": {"name": "sub", "arguments": {}}}) == [
        "expected: calls 'sub', which is not one of the record's tools (add)"]
    assert record_problems("eval", {**tool, "expected": {"name": "add", "arguments": {"a": "1", "b": 2}}}) == [
        "expected.arguments: a: '1' is not of type 'integer'"]
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"prompt": "p", "expected": ""}) + "\n")
    with pytest.raises(ValueError, match=r"eval\.jsonl:3: expected: a text or a tool call .* got an empty text"):
        read_records(path, "eval")


def test_the_examples_eval_file_is_usable():
    records = read_records(Path(training.__file__).parent / "examples" / "eval.jsonl", "eval")
    assert any(record.get("tools") for record in records)
