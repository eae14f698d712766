"""The eval phase's generation and its child process on a tiny random Qwen3-MoE (CPU): the adapter switched off
answers as the base model does, a non-zero adapter changes the answers and a zero one does not, and a child started
again answers only the samples not yet written."""

import json

import pytest
import torch
import yaml

from training.evaluation import __main__ as child
from training.examples import rewards
from training.evaluation.generate import TransformersGenerator, prompt_ids
from training.lora import routed_lora_wrappers
from training.recipe import load_recipe
from training.records import ByteTokenizer
from training.train import run as train

from .tiny_eval_run import CONFIG, EXAMPLES, train_tiny_eval_run
from .tiny_lora import tiny_lora_model
PROMPTS = ["43 + 42 =", "Name the capital of France, please.", [{"role": "user", "content": "hi"}]]


def _answers(generator, tokenizer, adapter):
    prompts = [prompt_ids(tokenizer, p) for p in PROMPTS]
    return generator.generate(prompts, 12, adapter=adapter)


def test_the_adapter_off_answers_as_the_base_model_and_on_differs():
    from transformers import AutoConfig, AutoModelForCausalLM

    model = tiny_lora_model(CONFIG).eval()
    tokenizer = ByteTokenizer(CONFIG["vocab_size"])
    generator = TransformersGenerator(model, tokenizer, torch.device("cpu"))
    tuned, base = _answers(generator, tokenizer, True), _answers(generator, tokenizer, False)
    assert tuned != base
    assert tuned == _answers(generator, tokenizer, True)  # greedy: the same again, the switch left no trace

    fields = dict(CONFIG)
    torch.manual_seed(0)  # the weights tiny_lora_model's base was built with
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)).float().eval()
    prompts = [prompt_ids(tokenizer, p) for p in PROMPTS]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = plain.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                         eos_token_id=tokenizer.eos_token_id)
    expected = []
    for row in out[:, width:].tolist():
        end = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        expected.append(tokenizer.decode(row[:end], skip_special_tokens=False))
    assert [text for text, _ in base] == expected


def test_a_zero_adapter_answers_as_the_base():
    model = tiny_lora_model(CONFIG).eval()
    with torch.no_grad():
        for _, _, wrapper in routed_lora_wrappers(model):
            for layer in wrapper.lora_B.values():
                layer.weight.zero_()
    tokenizer = ByteTokenizer(CONFIG["vocab_size"])
    generator = TransformersGenerator(model, tokenizer, torch.device("cpu"))
    assert _answers(generator, tokenizer, True) == _answers(generator, tokenizer, False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny_eval_run(tmp_path_factory.mktemp("run"))


def test_the_trainer_leaves_the_eval_phase_and_a_banked_run_has_nothing_to_train(trained):
    said = []
    train(load_recipe(trained), out=said.append)  # its final checkpoint is in the store: the box that only evaluates
    assert said[-1] == "run already complete; nothing to do"


def test_the_child_writes_every_sample_with_both_answers_and_scores(trained, tmp_path):
    samples = tmp_path / "samples.jsonl"
    assert child.main(["--recipe", str(trained), "--samples", str(samples), "--summary", str(tmp_path / "s.json")]) == 0
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    records = [json.loads(line) for line in (EXAMPLES / "eval.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(len(records)))
    for row, record in zip(rows, records, strict=True):
        assert set(row) == {"index", "prompt", "expected", "base_answer", "adapter_answer", "base_score",
                            "adapter_score"}
        assert row["expected"] == record["expected"]
        assert row["base_score"] == float(record["expected"] in " ".join(row["base_answer"].split()))
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["generated_with"] == "transformers" and summary["tokens_per_s"] > 0


def test_a_child_started_again_answers_only_what_is_not_done(trained, tmp_path, monkeypatch):
    samples = tmp_path / "samples.jsonl"
    written = {"prompt": "p", "expected": "e", "base_answer": "kept", "adapter_answer": "kept", "base_score": 0.0,
               "adapter_score": 1.0}
    samples.write_text(json.dumps({"index": 1, **written}) + "\n" + json.dumps({"index": 3, **written}) + "\n"
                       + '{"index": 4, "prompt": "half a li')  # the line a killed child was writing
    (tmp_path / "done.json").write_text("[0]")  # recorded by the dashboard
    asked = []
    generate = TransformersGenerator.generate

    def counted(self, prompts, max_new_tokens, *, adapter):
        asked.append((len(prompts), adapter))
        return generate(self, prompts, max_new_tokens, adapter=adapter)

    monkeypatch.setattr(TransformersGenerator, "generate", counted)
    assert child.main(["--recipe", str(trained), "--samples", str(samples), "--done", str(tmp_path / "done.json")]) == 0
    assert asked == [(2, True), (2, False)]  # samples 2 and 4, in one batch of two, each way
    lines = samples.read_text().splitlines()
    finished = [json.loads(line) for line in lines if line.endswith("}")]
    assert sorted(row["index"] for row in finished) == [1, 2, 3, 4]
    assert [row["base_answer"] for row in finished if row["index"] in (1, 3)] == ["kept", "kept"]


def test_a_scorer_out_of_range_fails_the_child_with_its_name(trained, tmp_path, capsys, monkeypatch):
    recipe = json.loads(trained.read_text())
    recipe["phases"][1]["scorer"] = "training.examples.rewards:answer_characters"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    monkeypatch.setattr(rewards, "answer_characters", lambda prompt, answer, record: 2.0)
    assert child.main(["--recipe", str(path), "--samples", str(tmp_path / "samples.jsonl")]) == 2
    assert "the scorer training.examples.rewards:answer_characters returned '2.0'" in capsys.readouterr().err
