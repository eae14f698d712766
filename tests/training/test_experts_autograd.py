"""The LoRA-aware experts function: forward and every gradient against the plain per-expert reference."""

import pytest
import torch

from training import moe_lora
from training.grouped_ops import experts_a, experts_b
from training.moe_lora import MoeLoraExperts
from training.reference import reference_moe_lora


def _problem(make_routing, dtype, num_tokens=9, hidden=12, inter=8, rank=4, experts=5, top_k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.5):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    index, weights = make_routing(num_tokens, experts, top_k, empty=(1,), generator=gen)
    # The LoRA factors as peft keeps them: A (r * E, in), B (out, r * E).
    return dict(
        x=rand(num_tokens, hidden, scale=1.0).requires_grad_(),
        index=index,
        weights=weights.to(dtype).requires_grad_(),
        w1=rand(experts, 2 * inter, hidden),
        w2=rand(experts, hidden, inter),
        a1=rand(rank * experts, hidden).requires_grad_(),
        b1=rand(2 * inter, rank * experts).requires_grad_(),
        a2=rand(rank * experts, inter).requires_grad_(),
        b2=rand(hidden, rank * experts).requires_grad_(),
    )


def _ours(p, path, s1=2.0, s2=0.5, accumulate=False):
    return MoeLoraExperts.apply(
        p["x"], p["index"], p["weights"], p["w1"], p["w2"], p["a1"], p["b1"], p["a2"], p["b2"], s1, s2, path,
        accumulate,
    )


def _reference(p, s1=2.0, s2=0.5):
    e = p["w1"].shape[0]
    lora1 = (experts_a(p["a1"], e), experts_b(p["b1"], e), s1)
    lora2 = (experts_a(p["a2"], e), experts_b(p["b2"], e), s2)
    return reference_moe_lora(p["x"], p["index"], p["weights"], p["w1"], p["w2"], lora1, lora2)


def test_it_passes_gradcheck_in_float64(make_routing):
    p = _problem(make_routing, torch.float64)
    inputs = (p["x"], p["weights"], p["a1"], p["b1"], p["a2"], p["b2"])

    def fn(x, weights, a1, b1, a2, b2):
        return MoeLoraExperts.apply(x, p["index"], weights, p["w1"], p["w2"], a1, b1, a2, b2, 2.0, 0.5, "loop",
                                    False)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", ["loop", "triton", "triton_scatter", "triton_fused"])
def test_it_matches_the_reference_forward_and_gradients(make_routing, path):
    p = _problem(make_routing, torch.float32, num_tokens=13, hidden=40, inter=24, rank=8, experts=6)
    for name in ("a1", "b1", "a2", "b2"):  # peft's factors live in one expert-interleaved matrix: make B count
        assert p[name].abs().min() > 0
    names = ("x", "weights", "a1", "b1", "a2", "b2")
    grad_out = torch.randn(13, 40, generator=torch.Generator().manual_seed(3))

    out = _ours(p, path)
    grads = torch.autograd.grad(out, [p[n] for n in names], grad_out)
    want = _reference(p)
    want_grads = torch.autograd.grad(want, [p[n] for n in names], grad_out)

    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for name, got, expected in zip(names, grads, want_grads, strict=True):
        assert got.shape == p[name].shape and got.dtype == p[name].dtype
        # fp32 sums over many rows in another order: within 1e-5 of the largest entry
        atol = 1e-5 * float(expected.abs().max())
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=atol, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("path", ["triton", "triton_fused"])
def test_it_takes_float32_factors_with_half_activations_and_returns_float32_gradients(make_routing, path):
    """peft keeps adapters in float32 over a bf16/fp16 model: the factors go in as they are and their gradients
    come back in float32, in peft's layout (fp16 here: Triton's interpreter computes bf16 wrongly)."""
    p = _problem(make_routing, torch.float32, num_tokens=13, hidden=40, inter=24, rank=8, experts=6)
    half = {k: (v.detach().half().requires_grad_(v.requires_grad) if k in ("x", "weights", "w1", "w2") else v)
            for k, v in p.items()}
    grad_out = torch.randn(13, 40, generator=torch.Generator().manual_seed(3))
    names = ("a1", "b1", "a2", "b2")
    out = _ours(half, path)
    grads = torch.autograd.grad(out, [half[n] for n in names], grad_out.half())
    want = _reference(p)
    want_grads = torch.autograd.grad(want, [p[n] for n in names], grad_out)
    assert out.dtype == torch.float16
    assert float((out.detach().float() - want.detach()).norm() / want.detach().norm()) < 1e-2
    for name, got, expected in zip(names, grads, want_grads, strict=True):
        assert got.dtype == torch.float32 and got.shape == p[name].shape
        assert float((got - expected).norm() / expected.norm()) < 1e-2, name


@pytest.mark.parametrize("path", ["loop", "triton", "triton_scatter", "triton_fused"])
def test_it_can_add_factor_gradients_into_grad_in_place_over_micro_steps(make_routing, path):
    """As the trainer runs it: the first micro-step's gradients are returned to autograd (no .grad yet), the next ones
    are added into the same .grad tensors, and the sums equal plain autograd's."""
    names = ("a1", "b1", "a2", "b2")
    p = _problem(make_routing, torch.float32, num_tokens=13, hidden=40, inter=24, rank=8, experts=6)
    grad_outs = [torch.randn(13, 40, generator=torch.Generator().manual_seed(seed)) for seed in (3, 4, 5)]
    want = [torch.zeros_like(p[n]) for n in names]
    for grad_out in grad_outs:
        for total, grad in zip(want, torch.autograd.grad(_reference(p), [p[n] for n in names], grad_out), strict=True):
            total += grad
    _ours(p, path, accumulate=True).backward(grad_outs[0])
    first = [p[n].grad for n in names]
    for grad_out in grad_outs[1:]:
        _ours(p, path, accumulate=True).backward(grad_out)
    for name, tensor, expected in zip(names, first, want, strict=True):
        assert p[name].grad is tensor, f"d{name} was replaced, not added into"
        torch.testing.assert_close(tensor, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    # Outside the context autograd adds them again, as usual.
    p["a1"].grad = None
    _ours(p, path).backward(grad_outs[0])
    assert p["a1"].grad is not None and p["a1"].grad is not first[0]


def test_it_gives_the_frozen_base_no_gradient(make_routing):
    p = _problem(make_routing, torch.float64)
    p["w1"].requires_grad_()
    _ours(p, "loop").sum().backward()
    assert p["w1"].grad is None
    assert p["a1"].grad is not None


def test_it_reports_the_kernel_path_it_used(tiny_model, tokens):
    from training.lora import attach_lora

    model = attach_lora(tiny_model, r=4, alpha=8)
    kernels = moe_lora.kernels_of(model)
    assert kernels.last_path is None
    model(input_ids=tokens)
    assert kernels.last_path == "loop"  # no GPU here: the CPU fallback
    kernels.path = "triton"
    model(input_ids=tokens)
    assert kernels.last_path == "triton"
    with pytest.raises(ValueError, match="unknown kernel path"):
        moe_lora.Kernels(path="cuda-magic")


def test_it_accumulates_in_place_only_inside_the_context_and_per_model(tiny_model, tokens):
    import copy

    from training.lora import attach_lora, randomize_routed_lora_b, routed_lora_wrappers

    other = attach_lora(copy.deepcopy(tiny_model), r=4, alpha=8)
    model = attach_lora(tiny_model, r=4, alpha=8)
    randomize_routed_lora_b(model, generator=torch.Generator().manual_seed(0))
    a = next(wrapper.lora_A[name].weight for _, _, wrapper in routed_lora_wrappers(model) for name in wrapper.lora_A)
    model(input_ids=tokens).logits.sum().backward()
    once = a.grad.clone()
    with moe_lora.grads_accumulated_in_place(model):
        assert moe_lora.kernels_of(model).accumulate_in_place
        assert not moe_lora.kernels_of(other).accumulate_in_place  # another model's experts are not touched
        model(input_ids=tokens).logits.sum().backward()  # added into .grad by the kernels, not returned
    torch.testing.assert_close(a.grad, 2 * once)
    assert not moe_lora.kernels_of(model).accumulate_in_place


def test_it_gives_the_same_logits_as_transformers_experts_without_lora(tiny_model, tokens):
    want = tiny_model(input_ids=tokens).logits
    moe_lora.use_moe_lora(tiny_model)
    got = tiny_model(input_ids=tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
