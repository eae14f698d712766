"""The fused RMSNorm kernels (Triton's interpreter on the CPU) against transformers' own RMSNorm."""

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

from training.kernels.rmsnorm import rms_norm
from training.norms import use_fused_rms_norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 5, 40), (2, 7, 3, 16)])  # a hidden-state norm; a per-head (q/k) norm
def test_it_computes_transformers_rmsnorm_and_its_input_gradient(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    norm = Qwen3MoeRMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(shape[-1], generator=gen) + 0.5)
    norm = norm.to(dtype).requires_grad_(False)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype).requires_grad_()
    grad = torch.randn(*shape, generator=gen).to(dtype)

    want = norm(x)
    (want_dx,) = torch.autograd.grad(want, x, grad)
    got = rms_norm(x, norm.weight, norm.variance_epsilon)
    (got_dx,) = torch.autograd.grad(got, x, grad)

    assert got.dtype == want.dtype and got.shape == want.shape
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_dx, want_dx, **tol)


def test_the_models_norms_switch_and_keep_their_state(tiny_model, tokens):
    keys = set(tiny_model.state_dict())
    want = tiny_model(input_ids=tokens).logits
    switched = use_fused_rms_norms(tiny_model)
    # per layer: input, post-attention, q and k norms; and the final norm
    assert switched == 4 * tiny_model.config.num_hidden_layers + 1
    assert set(tiny_model.state_dict()) == keys
    assert type(tiny_model.model.norm).__name__ == "FusedQwen3MoeRMSNorm"
    # on the CPU the class's own forward runs: the same logits
    torch.testing.assert_close(tiny_model(input_ids=tokens).logits, want)
