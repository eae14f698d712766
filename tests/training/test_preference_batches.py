"""DPO and KTO batches padded to a length bucket (what CUDA graphs replay) train and report as batches padded to
their longest pair: the same loss, gradients, tokens, accuracy, margin and KL."""

import random

import pytest
import torch

from training import distributed, phase, train
from training.data import bucket_length, collate, length_buckets
from training.examples.tiny import tiny_recipe
from training.graphs import eager_micro_step
from training.lora import attach_lora, randomize_routed_lora_b
from training.losses import LOSSES
from training.recipe import RunRecipe

PHASES = {"dpo": {"kind": "dpo", "beta": 0.1},
          "kto": {"kind": "kto", "beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.33}}


def test_buckets_climb_two_to_a_doubling_up_to_seq_len():
    assert length_buckets(2048) == [128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    assert length_buckets(200) == [128, 192, 200]
    assert length_buckets(64) == [64]
    assert [bucket_length(n, 2048) for n in (1, 128, 129, 193, 1537, 2048)] == [128, 128, 192, 256, 2048, 2048]


def _items(kind, count, rng):
    def ids():
        return [rng.randrange(3, 64) for _ in range(rng.randint(1, 12))]

    def pair():
        return ids(), ids()

    if kind == "dpo":
        return [{"chosen": pair(), "rejected": pair()} for _ in range(count)]
    return [{"pair": pair(), "desirable": i % 3 != 0} for i in range(count)]


@pytest.mark.parametrize("kind", ["dpo", "kto"])
def test_padding_to_a_bucket_gives_the_loss_stats_and_gradients_of_padding_to_the_longest(kind, tiny_model):
    model = attach_lora(tiny_model, r=4, alpha=8)
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    items = _items(kind, 4, random.Random(0))
    rows = 2 * len(items) if kind == "dpo" else len(items)
    ref_logps = torch.randn(rows, generator=torch.Generator().manual_seed(1)) - 20

    def step(seq_len):
        batch = {**collate(kind, items, 0, seq_len), "ref_logps": ref_logps}
        model.zero_grad(set_to_none=True)
        loss, stats = LOSSES[kind](model, batch, PHASES[kind], {})
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        return batch["input_ids"].shape[1], loss.detach(), stats, grads

    longest_width, longest_loss, longest_stats, longest_grads = step(None)
    bucket_width, bucket_loss, bucket_stats, bucket_grads = step(64)
    assert longest_width < bucket_width == 64
    torch.testing.assert_close(bucket_loss, longest_loss)
    assert longest_stats.keys() == bucket_stats.keys()
    for key, value in longest_stats.items():
        torch.testing.assert_close(torch.as_tensor(bucket_stats[key]), torch.as_tensor(value), msg=key)
    # Every real token counted once, the padding never.
    pairs = [it[k] for it in items for k in ("chosen", "rejected")] if kind == "dpo" else [it["pair"] for it in items]
    assert int(bucket_stats["tokens"]) == sum(len(prompt) + len(completion) for prompt, completion in pairs)
    assert any(g.abs().sum() > 0 for g in longest_grads)
    for got, want in zip(bucket_grads, longest_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


class _EagerGraphs:
    """What the training loop sees of MicroStepGraphs, with every micro-step eager: on the CPU the batches then
    take the bucketed shapes that graphs replay on a GPU."""

    def __init__(self, params):
        self.params = params

    def run(self, *args):
        return eager_micro_step(*args)

    def zero_grads(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


class _Saves:
    """Keeps each checkpoint's state instead of uploading it."""

    def __init__(self):
        self.states = []

    def save(self, model, state, name, exports=()):
        self.states.append(state)


def _phase_records(tmp_path, monkeypatch, bucketed):
    recipe = tiny_recipe(tmp_path, phases=[("dpo", 3), ("kto", 3)], seq_len=256)
    widths = []  # (seq_len the batch was bucketed for or None, its width)

    def collate_spy(kind, items, pad_id, seq_len=None, width=None):
        batch = collate(kind, items, pad_id, seq_len, width)
        widths.append((seq_len, batch["input_ids"].shape[1]))
        return batch

    monkeypatch.setattr(phase, "collate", collate_spy)
    typed = RunRecipe.from_dict(recipe)
    base = train.build_model(typed.model, "cpu")
    tokenizer = train.load_tokenizer(recipe["model"], base.config.vocab_size)
    model = attach_lora(base, r=typed.lora.r, alpha=typed.lora.alpha)
    model.train()
    groups = train.parameter_groups(model)
    trainee = phase.Trainee(model, groups, distributed.OneRank(torch.device("cpu")),
                            _EagerGraphs(groups["trainable"]) if bucketed else None, typed.max_grad_norm)
    records, saves = [], _Saves()
    sink = type("ListSink", (), {"emit": staticmethod(records.append)})()
    for index in range(len(typed.phases)):
        started = phase.Phase(typed, index, trainee, tokenizer, [sink], saves, out=lambda line: None)
        started.start()
        train.run_phase(started)
    return records, widths, [state["reference"] for state in saves.states]


def test_the_training_loop_reports_the_same_on_bucketed_batches(tmp_path, monkeypatch):
    eager, eager_widths, eager_refs = _phase_records(tmp_path / "eager", monkeypatch, bucketed=False)
    bucketed, bucketed_widths, bucketed_refs = _phase_records(tmp_path / "bucketed", monkeypatch, bucketed=True)
    assert {s for s, _ in eager_widths} == {None} and max(w for _, w in eager_widths) < 128
    # Training batches padded to the first bucket (the example's pairs are short), the reference scored as before.
    assert {w for s, w in bucketed_widths if s == 256} == {128}
    # Saved at steps 2 and 3 of each phase. The DPO reference is the very same; the KTO one is scored by the adapter
    # DPO left, which the bucketed run reached through other rounding.
    assert len(bucketed_refs) == len(eager_refs) == 4
    assert torch.equal(bucketed_refs[0], eager_refs[0]) and torch.equal(bucketed_refs[1], eager_refs[0])
    torch.testing.assert_close(bucketed_refs[2], eager_refs[2], rtol=1e-6, atol=0)
    assert [(r["kind"], r["step"]) for r in bucketed] == [(k, s) for k in ("dpo", "kto") for s in (1, 2, 3)]
    for got, want in zip(bucketed, eager, strict=True):
        assert got["tokens"] == want["tokens"] > 0 and isinstance(got["tokens"], int)
        for key in ("loss", "rewards_accuracy", "rewards_margin", "kl", "grad_norm_total", "grad_norm_routed"):
            if want.get(key) is not None:
                assert isinstance(got[key], float)
                # The margin is a difference of summed log-probs (hundreds each): float32 leaves it ~1e-5 of noise.
                slack = 2e-5 if key == "rewards_margin" else 1e-6
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=slack), (got["kind"], got["step"], key)
        assert set(got) - {"time", "step_s", "tokens_per_s"} == set(want) - {"time", "step_s", "tokens_per_s"}
    assert any(r["rewards_margin"] != 0 for r in eager if r["kind"] == "dpo")
    assert any(r["kl"] > 0 for r in eager if r["kind"] == "kto")
