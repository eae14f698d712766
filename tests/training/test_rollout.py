"""GRPO's rollout sampler (training/rollout.py): transformers' greedy tokens, seeded sampling from the model's
tempered distribution, padding after eos, the early stop; on a GPU, the graphed decode against eager and
transformers'."""

import os

import pytest
import torch

from training import rollout
from training.lora import attach_lora, randomize_routed_lora_b

PAD = 0


def _left_padded(lengths, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, vocab, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids, mask


def _lora(model):
    model = attach_lora(model, r=4, alpha=8)
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(3))
    return model


def _greedy_generate(model, ids, mask, max_new_tokens, eos):
    model.eval()
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=False,
                         max_new_tokens=max_new_tokens, pad_token_id=PAD, eos_token_id=eos)[:, ids.shape[1]:]
    return torch.nn.functional.pad(out, (0, max_new_tokens - out.shape[1]), value=PAD)


def test_greedy_completions_are_transformers_greedy_tokens_with_eos_and_padding(tiny_model):
    model = _lora(tiny_model)
    ids, mask = _left_padded([5, 9, 3, 7], 64, seed=1)
    free = rollout.sample(model, ids, mask, 12, 0.0, None, PAD)
    assert torch.equal(free, _greedy_generate(model, ids, mask, 12, None))
    eos = int(free[0, 3])  # row 0 ends by its fourth token; the others when they first make it
    ended = rollout.sample(model, ids, mask, 12, 0.0, eos, PAD)
    assert torch.equal(ended, _greedy_generate(model, ids, mask, 12, eos))
    first = int((free[0] == eos).nonzero()[0])
    assert first <= 3 and torch.equal(ended[0, :first + 1], free[0, :first + 1])
    assert (ended[0, first + 1:] == PAD).all()
    # A narrower batch after a wider one, through the same cache: nothing of the earlier rollout shows.
    ids, mask = _left_padded([2, 6, 4, 1], 64, seed=2)
    assert torch.equal(rollout.sample(model, ids, mask, 12, 0.0, eos, PAD), _greedy_generate(model, ids, mask, 12, eos))


def test_sampling_is_reproducible_with_a_seeded_generator_and_differs_with_another(tiny_model):
    model = _lora(tiny_model)
    ids, mask = _left_padded([5, 9, 3, 7], 64, seed=1)

    def draw(seed):
        return rollout.sample(model, ids, mask, 16, 1.0, None, PAD, generator=torch.Generator().manual_seed(seed))

    first = draw(11)
    assert torch.equal(draw(11), first)
    assert not torch.equal(draw(12), first)


def test_sampled_tokens_follow_the_models_tempered_distribution(tiny_model):
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(20)  # logits of a few units, so the temperature visibly sharpens them
    prompt = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(4))
    rows, temperature = 8192, 0.7
    ids, mask = prompt.expand(rows, -1), torch.ones(rows, 6, dtype=torch.long)
    generator = torch.Generator().manual_seed(5)
    tokens = rollout.sample(tiny_model, ids, mask, 1, temperature, None, PAD, generator=generator)
    seen = torch.bincount(tokens[:, 0], minlength=64).double() / rows
    with torch.no_grad():
        logits = tiny_model(input_ids=prompt).logits[0, -1].double()
    target, untempered = torch.softmax(logits / temperature, -1), torch.softmax(logits, -1)
    assert 0.5 * (seen - target).abs().sum() < 0.03
    assert 0.5 * (target - untempered).abs().sum() > 0.1  # so the check above tells the temperature apart


def test_it_stops_once_every_row_has_ended(tiny_model):
    model = _lora(tiny_model)
    ids, mask = _left_padded([5, 9, 3, 7], 64, seed=1)
    forwards = []
    model.get_base_model().model.register_forward_hook(lambda *args: forwards.append(1))
    eos, max_new_tokens = 7, 300
    # A high temperature: every token about as likely, so each row makes eos after some tens of tokens.
    out = rollout.sample(model, ids, mask, max_new_tokens, 50.0, eos, PAD, generator=torch.Generator().manual_seed(2))
    ends = [int((row == eos).nonzero()[0]) for row in out]
    for row, end in zip(out, ends, strict=True):
        assert (row[end + 1:] == PAD).all()
    assert len(forwards) <= max(ends) + 1 + rollout.CHECK_EVERY < max_new_tokens


def test_only_full_attention_models_decode_from_the_static_cache(tiny_config):
    from transformers import AutoConfig

    from training.examples.tiny import TINY_QWEN3_5_CONFIG

    tiny_config._attn_implementation = "sdpa"
    assert rollout.static_decode_fits(tiny_config)
    fields = dict(TINY_QWEN3_5_CONFIG)
    hybrid = AutoConfig.for_model(fields.pop("model_type"), **fields)
    hybrid._attn_implementation = "sdpa"
    assert not rollout.static_decode_fits(hybrid)  # DeltaNet layers: transformers' generate samples these


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="CUDA graphs need a GPU (run with TRITON_INTERPRET=0)")
def test_graphed_greedy_decode_matches_eager_and_transformers_on_a_gpu(monkeypatch):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                            num_experts=16, num_experts_per_tok=4, max_position_embeddings=256, initializer_range=0.1)
    torch.manual_seed(0)
    model = _lora(Qwen3MoeForCausalLM(config).to("cuda", torch.bfloat16))
    ids, mask = _left_padded([20, 33, 7, 28, 12, 31, 25, 16], 512, seed=1)
    ids, mask = ids.cuda(), mask.cuda()
    with monkeypatch.context() as patched:
        patched.setattr(rollout, "WARMUP_STEPS", 10**9)  # never captured: every step eager
        eager = rollout.sample(model, ids, mask, 24, 0.0, None, PAD)
    graphed = rollout.sample(model, ids, mask, 24, 0.0, None, PAD)  # captured at its first decode step
    decoders = model.get_base_model().__dict__[rollout.DECODERS_ATTRIBUTE]
    assert all(d.graph is not None for d in decoders.values())
    assert torch.equal(graphed, eager)
    assert torch.equal(rollout.sample(model, ids, mask, 24, 0.0, None, PAD), graphed)  # replayed

    # transformers' tokens, up to where a row's two candidates are within bf16 rounding of each other: the
    # attention there sums over another cache length, which may move a near tie either way.
    theirs = _greedy_generate(model, ids, mask, 24, None)
    for row in range(ids.shape[0]):
        differ = (graphed[row] != theirs[row]).nonzero()
        if len(differ) == 0:
            continue
        at = int(differ[0])
        prefix = torch.cat([ids[row][mask[row].bool()], graphed[row, :at]])[None]
        with torch.no_grad():
            logits = model(input_ids=prefix).logits[0, -1].float()
        gap = (logits[graphed[row, at]] - logits[theirs[row, at]]).abs()
        assert gap <= 0.02 * logits.abs().max(), (row, at, float(gap))

    def draw(seed):  # sampled: its own graph; the first call captures, the second replays
        return rollout.sample(model, ids, mask, 24, 1.0, None, PAD, generator=torch.Generator().manual_seed(seed))

    first = draw(3)
    assert torch.equal(draw(3), first)
    assert not torch.equal(draw(4), first)


def test_release_gives_back_every_kept_cache(tiny_model):
    model = _lora(tiny_model)
    for width in (5, 70):  # two shapes: two caches kept
        ids, mask = _left_padded([width, 3], 64, seed=3)
        rollout.sample(model, ids, mask, 4, 1.0, -1, PAD, generator=torch.Generator().manual_seed(0))
    assert rollout.release(model) == 2
    assert rollout.release(model) == 0
