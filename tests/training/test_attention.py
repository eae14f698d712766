"""packed_sdpa computes what transformers' SDPA attention computes, for every kind of batch the trainer builds and for
a caller's own positions, but from the rows' description instead of a (B, 1, L, L) mask; on a GPU the packed rows
run flash attention's variable-length kernels."""

import pytest
import torch

from tests.training.tiny_lora import tiny_lora_model
from training import attention
from training.attention import RowSegments, use_packed_attention
from training.data import _pack, boundaries_width, collate, pad_pairs
from training.examples.tiny import TINY_CONFIG
from training.losses import causal_lm_loss, dpo_loss
from training.packing import cu_seq_lens

SEQ_LEN = 24


def _loss_and_grads(model, loss_fn, batch, phase, implementation):
    model.config._attn_implementation = implementation
    model.zero_grad(set_to_none=True)
    loss, _ = loss_fn(model, batch, phase, {})
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _batches():
    generator = torch.Generator().manual_seed(3)
    samples = [torch.randint(3, 260, (n,), generator=generator).tolist() for n in (7, 5, 9, 11, 6, 30)]
    packed = collate("cpt", _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0), pad_id=0)
    whole = torch.randint(3, 260, (2, SEQ_LEN), generator=generator)
    pairs = [(samples[i][:3], samples[i][3:]) for i in range(4)]
    dpo = pad_pairs(pairs, pad_id=0, seq_len=SEQ_LEN)
    dpo["ref_logps"] = torch.zeros(4)
    return {
        "packed rows": (causal_lm_loss, packed, {"kind": "cpt"}),
        "whole rows": (causal_lm_loss, {"input_ids": whole, "labels": whole}, {"kind": "cpt"}),
        "padded pairs": (dpo_loss, dpo, {"kind": "dpo", "beta": 0.1}),
    }


@pytest.mark.parametrize("kind", ["packed rows", "whole rows", "padded pairs"])
def test_it_gives_transformers_sdpa_loss_and_gradients(kind):
    model = tiny_lora_model(TINY_CONFIG)
    assert model.config._attn_implementation == attention.NAME  # attach_lora switched it
    loss_fn, batch, phase = _batches()[kind]
    ours, our_grads = _loss_and_grads(model, loss_fn, batch, phase, attention.NAME)
    theirs, their_grads = _loss_and_grads(model, loss_fn, batch, phase, "sdpa")
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert our_grads.keys() == their_grads.keys() and len(our_grads) > 0
    for name in our_grads:
        torch.testing.assert_close(our_grads[name], their_grads[name], rtol=1e-5, atol=1e-6)


def test_a_callers_packed_positions_still_keep_the_samples_apart():
    # Positions from a caller that does not say what its rows are: the mask comes from them, as in transformers.
    model = tiny_lora_model(TINY_CONFIG)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    ids = torch.randint(3, 260, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        alone = model(input_ids=ids[:, 4:], use_cache=False).logits
        model.config._attn_implementation = "sdpa"
        theirs = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(packed[:, 4:], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, theirs, rtol=1e-6, atol=1e-6)


def test_rows_need_no_mask_unless_padded_or_cached():
    common = {"batch_size": 2, "q_length": 8, "kv_length": 8, "device": "cpu"}
    assert attention._mask(**common) is None
    padded = attention._mask(**common, attention_mask=torch.tensor([[1] * 8, [1] * 6 + [0] * 2]).bool())
    assert padded.shape == (2, 1, 8, 8) and not padded[1, 0, 7, 6] and padded[1, 0, 5, 0]
    # one new token against a cache of 8: transformers' own mask, whatever it is
    from transformers.masking_utils import sdpa_mask

    for cached in ({**common, "q_length": 1}, {**common, "q_length": 4, "q_offset": 4}):
        ours, theirs = attention._mask(**cached), sdpa_mask(**cached)
        assert (ours is None) == (theirs is None) and (ours is None or torch.equal(ours, theirs))


def test_the_boundaries_cover_each_sample_and_pad_to_a_power_of_two():
    ends = cu_seq_lens([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    assert ends.tolist() == [0, 3, 5, 10] and ends.dtype == torch.int32
    assert cu_seq_lens([[0, 1, 0, 1, 0]]).tolist() == [0, 2, 4, 5]
    assert cu_seq_lens([[0, 0, 0, 0, 0]]).tolist() == [0, 1, 2, 3, 4, 5, 5, 5]  # 6 -> 8 entries, padded with 5
    assert cu_seq_lens([[0, 1, 2, 3]], width=4).tolist() == [0, 4, 4, 4]
    with pytest.raises(ValueError, match="do not fit"):
        cu_seq_lens([[0, 0, 0, 0]], width=4)


def test_packed_batches_carry_their_boundaries():
    rows = _pack([([5] * 10, [5] * 10), ([6] * 10, [6] * 10), ([7] * 30, [7] * 30)], SEQ_LEN, pad_id=0)
    batch = collate("cpt", rows, pad_id=0)
    assert batch["cu_seq_lens"].tolist() == [0, 10, 20, 24, 48, 54, 72, 72]


def test_a_model_outside_the_listed_families_keeps_its_attention():
    class Config:
        model_type, _attn_implementation = "gemma", "sdpa"

    class Model:
        config = Config()

    assert not use_packed_attention(Model()) and Model.config._attn_implementation == "sdpa"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash attention's kernels need a GPU")
def test_the_variable_length_kernels_match_masked_sdpa_in_bf16_on_the_gpu():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Module:
        is_causal, num_key_value_groups = True, 4

    torch.manual_seed(0)
    batch, length = 2, 512
    q = torch.randn(batch, 16, length, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, 4, length, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, 4, length, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    positions = [list(range(100)) + list(range(300)) + list(range(112)), list(range(length))]
    rows = RowSegments(cu_seq_lens(positions).cuda())
    assert rows.cu_seq_lens.numel() == 8  # 4 samples, 3 empty ones after them
    grad = torch.randn(batch, length, 16, 128, device="cuda", dtype=torch.bfloat16)
    ours, _ = attention.packed_sdpa_attention(Module(), q, k, v, None, scaling=128 ** -0.5, row_segments=rows)
    (ours.float() * grad).sum().backward()
    our_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    mask = attention._document_mask(attention._segment_ids_from_boundaries(rows.cu_seq_lens, batch, length))
    theirs, _ = sdpa_attention_forward(Module(), q, k, v, mask, scaling=128 ** -0.5)
    (theirs.float() * grad).sum().backward()
    assert ours.shape == theirs.shape == (batch, length, 16, 128)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    for mine, reference in zip(our_grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(mine.float(), reference.float(), rtol=5e-2, atol=5e-2)


def test_one_width_covers_every_micro_batch_of_a_phase():
    rows = _pack([([5] * n, [5] * n) for n in (3, 4, 20, 2, 2, 2, 2, 9, 24, 1)], SEQ_LEN, pad_id=0)
    width = boundaries_width(rows, 2)
    shapes = {collate("cpt", list(pair), pad_id=0, width=width)["cu_seq_lens"].shape
              for pair in zip(rows, rows[1:] + rows[:1], strict=True)}
    widest = max(len(collate("cpt", [a, b], pad_id=0)["cu_seq_lens"]) for a in rows for b in rows)
    assert shapes == {(width,)} and width >= widest


def test_padded_rows_score_without_a_mask_as_with_it():
    # DPO/KTO's rows are right-padded: causality suffices. GRPO's are left-padded (the prompts): turned so that
    # their tokens start the row, they need no mask either. Same per-row log-probs and gradients as transformers'
    # masked sdpa.
    from training.losses import token_logps

    model = tiny_lora_model(TINY_CONFIG)
    lora = [p for name, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        for p in lora:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.05)
    ids = torch.randint(3, 260, (3, 10), generator=torch.Generator().manual_seed(2))
    left = torch.tensor([[0, 0, 0] + [1] * 7, [1] * 10, [0] * 5 + [1] * 4 + [0]])  # the last: a completion ended
    right = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 4 + [0] * 6])
    weights = torch.tensor([[1.0], [-2.0], [0.5]])

    def scored(mask, padding):
        # Each row's first token is no label (a prompt's never is: what would predict it is padding, or nothing).
        labels = ids.masked_fill((mask == 0) | (mask.cumsum(-1) == 1), -100)
        model.zero_grad()
        logps, tokens = token_logps(model, ids, mask, labels, padding=padding)
        (logps * weights).sum().backward()
        return logps.sum(-1).detach(), tokens.sum(-1), [p.grad.clone() for p in lora]

    ours = {padding: scored(mask, padding) for padding, mask in (("left", left), ("right", right))}
    model.config._attn_implementation = "sdpa"
    theirs = {padding: scored(mask, padding) for padding, mask in (("left", left), ("right", right))}
    unmasked, _, _ = scored(torch.ones_like(left), None)
    for padding in ("left", "right"):
        (got, got_tokens, got_grads), (want, want_tokens, want_grads) = ours[padding], theirs[padding]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got_tokens, want_tokens)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert (theirs["left"][0][0] - unmasked[0]).abs() > 1e-3  # the left padding's mask did matter there
