"""The LoRA-aware experts function: forward and every gradient against the plain per-expert reference."""

import pytest
import torch

from training import moe_lora
from training.moe_lora import MoeLoraExperts
from training.reference import reference_moe_lora


def _problem(make_routing, dtype, num_tokens=9, hidden=12, inter=8, rank=4, experts=5, top_k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.5):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    index, weights = make_routing(num_tokens, experts, top_k, empty=(1,), generator=gen)
    return dict(
        x=rand(num_tokens, hidden, scale=1.0).requires_grad_(),
        index=index,
        weights=weights.to(dtype).requires_grad_(),
        w1=rand(experts, 2 * inter, hidden),
        w2=rand(experts, hidden, inter),
        a1=rand(experts, rank, hidden).requires_grad_(),
        b1=rand(experts, 2 * inter, rank).requires_grad_(),
        a2=rand(experts, rank, inter).requires_grad_(),
        b2=rand(experts, hidden, rank).requires_grad_(),
    )


def _ours(p, path, s1=2.0, s2=0.5):
    return MoeLoraExperts.apply(
        p["x"], p["index"], p["weights"], p["w1"], p["w2"], p["a1"], p["b1"], p["a2"], p["b2"], s1, s2, path
    )


def _reference(p, s1=2.0, s2=0.5):
    return reference_moe_lora(
        p["x"], p["index"], p["weights"], p["w1"], p["w2"], (p["a1"], p["b1"], s1), (p["a2"], p["b2"], s2)
    )


def test_it_passes_gradcheck_in_float64(make_routing):
    p = _problem(make_routing, torch.float64)
    inputs = (p["x"], p["weights"], p["a1"], p["b1"], p["a2"], p["b2"])

    def fn(x, weights, a1, b1, a2, b2):
        return MoeLoraExperts.apply(x, p["index"], weights, p["w1"], p["w2"], a1, b1, a2, b2, 2.0, 0.5, "loop")

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", ["loop", "triton"])
def test_it_matches_the_reference_forward_and_gradients(make_routing, path):
    p = _problem(make_routing, torch.float32, num_tokens=13, hidden=40, inter=24, rank=8, experts=6)
    names = ("x", "weights", "a1", "b1", "a2", "b2")
    grad_out = torch.randn(13, 40, generator=torch.Generator().manual_seed(3))

    out = _ours(p, path)
    grads = torch.autograd.grad(out, [p[n] for n in names], grad_out)
    want = _reference(p)
    want_grads = torch.autograd.grad(want, [p[n] for n in names], grad_out)

    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for name, got, expected in zip(names, grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"d{name}: {m}")


def test_it_gives_the_frozen_base_no_gradient(make_routing):
    p = _problem(make_routing, torch.float64)
    p["w1"].requires_grad_()
    _ours(p, "loop").sum().backward()
    assert p["w1"].grad is None
    assert p["a1"].grad is not None


def test_it_reports_the_kernel_path_it_used(tiny_model, tokens):
    from training.lora import attach_lora

    model = attach_lora(tiny_model, r=4, alpha=8)
    model(input_ids=tokens)
    assert moe_lora.kernel_path() == "loop"  # no GPU here: the CPU fallback
    moe_lora.set_kernel_path("triton")
    try:
        model(input_ids=tokens)
        assert moe_lora.kernel_path() == "triton"
    finally:
        moe_lora.set_kernel_path(None)
    with pytest.raises(ValueError):
        moe_lora.set_kernel_path("cuda-magic")


def test_it_gives_the_same_logits_as_transformers_experts_without_lora(tiny_model, tokens):
    want = tiny_model(input_ids=tokens).logits
    moe_lora.use_moe_lora(tiny_model)
    got = tiny_model(input_ids=tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
