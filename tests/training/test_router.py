"""The fused top-k softmax router (Triton's interpreter on the CPU) against transformers' own router."""

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from training.routers import TopKSoftmax, use_fused_routers


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("experts, top_k, normalize", [(6, 2, True), (12, 4, False), (16, 8, True)])
def test_it_routes_like_transformers_router_and_back(dtype, experts, top_k, normalize):
    gen = torch.Generator().manual_seed(experts)
    config = Qwen3MoeConfig(hidden_size=24, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=normalize)
    router = Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, 24, generator=gen))
    router = router.to(dtype).requires_grad_(False)
    x = torch.randn(23, 24, generator=gen).to(dtype).requires_grad_()  # 23 tokens: a partial token block
    grad = torch.randn(23, top_k, generator=gen).to(dtype)

    _, want_weights, want_index = router(x)
    (want_dx,) = torch.autograd.grad(want_weights, x, grad)
    got_weights, got_index = TopKSoftmax.apply(F.linear(x, router.weight), top_k, normalize)
    (got_dx,) = torch.autograd.grad(got_weights, x, grad)

    assert torch.equal(got_index, want_index)  # the same experts, largest first
    assert got_weights.dtype == want_weights.dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(got_weights, want_weights, **tol)
    torch.testing.assert_close(got_dx, want_dx, **tol)
    if normalize:
        torch.testing.assert_close(got_weights.float().sum(-1), torch.ones(23), **tol)


def test_the_models_routers_switch_and_keep_their_state(tiny_model, tokens):
    keys = set(tiny_model.state_dict())
    want = tiny_model(input_ids=tokens).logits
    assert use_fused_routers(tiny_model) == tiny_model.config.num_hidden_layers
    assert set(tiny_model.state_dict()) == keys
    assert type(tiny_model.model.layers[0].mlp.gate).__name__ == "FusedQwen3MoeTopKRouter"
    # on the CPU the class's own forward runs: the same logits
    torch.testing.assert_close(tiny_model(input_ids=tokens).logits, want)


def test_the_trainers_lora_model_runs_the_fused_routers(tiny_model):
    from training.lora import attach_lora

    model = attach_lora(tiny_model, r=4, alpha=8)
    gates = [layer.mlp.gate for layer in model.get_base_model().model.layers]
    assert gates and all(type(gate).__name__ == "FusedQwen3MoeTopKRouter" for gate in gates)
