"""The fused rotary embedding is transformers' own, forward and backward, on the layouts attention hands it."""

import pytest
import torch
from transformers.models.qwen3_moe import modeling_qwen3_moe

from training.kernels.rope import rotary_embedding, supported
from training.rope import restore_original_rope, use_fused_rope

REFERENCE = getattr(modeling_qwen3_moe.apply_rotary_pos_emb, "__wrapped__", modeling_qwen3_moe.apply_rotary_pos_emb)


def _inputs(dtype, device="cpu", batch=2, heads_q=4, heads_k=2, seq=24, dim=32, cos_batch=1):
    gen = torch.Generator().manual_seed(0)
    # As Qwen3-MoE's attention makes them: (B, S, H, D) memory seen as (B, H, S, D).
    q = torch.randn(batch, seq, heads_q, dim, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(batch, seq, heads_k, dim, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()
    angles = torch.rand(cos_batch, seq, dim // 2, generator=gen) * 6
    angles = torch.cat([angles, angles], dim=-1)
    return q, k, angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _both(fn, q, k, cos, sin):
    qo, ko = fn(q, k, cos, sin)
    gen = torch.Generator().manual_seed(1)
    gq = torch.randn(qo.shape, generator=gen).to(qo)
    gk = torch.randn(ko.shape, generator=gen).to(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    return qo, ko, dq, dk


@pytest.mark.parametrize("cos_batch", [1, 2])
@pytest.mark.parametrize("dtype, exact", [(torch.float32, True), (torch.float16, False)])
def test_it_gives_transformers_embedding_and_gradients(dtype, exact, cos_batch):
    q, k, cos, sin = _inputs(dtype, cos_batch=cos_batch)
    assert supported(q, k, cos, sin)
    got = _both(rotary_embedding, q, k, cos, sin)
    want = _both(REFERENCE, q, k, cos, sin)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if exact:
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        else:  # one rounding apart at most where the interpreter and PyTorch's CPU half arithmetic differ
            torch.testing.assert_close(g, w, rtol=2e-3, atol=2e-3)
    # The results keep the queries' memory layout, as PyTorch's elementwise ops do.
    assert got[0].stride() == q.stride() and got[1].stride() == k.stride()


def test_it_refuses_what_it_does_not_cover():
    q, k, cos, sin = _inputs(torch.float32)
    assert not supported(q, k, cos[..., :16], sin[..., :16])  # a partial rotary dim
    assert not supported(q, k, cos.requires_grad_(), sin)
    q3, k3, cos3, sin3 = _inputs(torch.float32, dim=24)
    assert not supported(q3, k3, cos3, sin3)  # not a power of two


def test_a_model_calls_the_fused_embedding_and_keeps_its_outputs_on_the_cpu():
    from training.examples.tiny import TINY_CONFIG
    from training.recipe import ModelSettings
    from training.train import build_model

    model = build_model(ModelSettings(config=TINY_CONFIG, dtype="float32"), "cpu")
    ids = torch.randint(0, TINY_CONFIG["vocab_size"], (2, 10))
    before = model(input_ids=ids).logits
    restore_original_rope()  # whatever an earlier test of this process switched
    original = modeling_qwen3_moe.apply_rotary_pos_emb
    assert use_fused_rope(model) == 2
    assert getattr(modeling_qwen3_moe.apply_rotary_pos_emb, "fused_rope", False)
    assert use_fused_rope(model) == 2  # again: the function is not wrapped twice
    assert modeling_qwen3_moe.apply_rotary_pos_emb.__wrapped__ is original
    assert restore_original_rope() == 1 and modeling_qwen3_moe.apply_rotary_pos_emb is original
    assert restore_original_rope() == 0
    assert torch.equal(model(input_ids=ids).logits, before)  # on the CPU the original runs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on the GPU")
def test_it_agrees_with_transformers_in_bf16_on_the_gpu_and_is_no_less_exact():
    q, k, cos, sin = _inputs(torch.bfloat16, "cuda", batch=2, heads_q=32, heads_k=4, seq=2048, dim=128)
    got = _both(rotary_embedding, q, k, cos, sin)
    want = _both(REFERENCE, q, k, cos, sin)
    as64 = [t.detach().double() for t in (q, k, cos, sin)]
    exact = _both(REFERENCE, as64[0].requires_grad_(), as64[1].requires_grad_(), as64[2], as64[3])
    for g, w, e in zip(got, want, exact, strict=True):
        g, w, e = g.detach().double(), w.detach().double(), e.detach().double()
        # bf16 roundings apart from transformers' (at most two steps at the tensor's largest values)...
        assert (g - w).abs().max() <= 2**-6 * w.abs().max()
        assert (g == w).float().mean() > 0.5
        assert (g - e).abs().mean() <= (w - e).abs().mean()  # ...and on average at least as close to exact
