"""The fused RMSNorm kernels (Triton's interpreter on the CPU) against transformers' own RMSNorm."""

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

from tests.training.kernel_dtypes import INTERPRETER_AND_GPU
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


@pytest.mark.parametrize("dtype, tol, device", INTERPRETER_AND_GPU)
def test_working_from_the_output_gives_the_input_gradient_and_keeps_only_the_output(dtype, tol, device):
    gen = torch.Generator().manual_seed(1)
    weight = ((torch.rand(48, generator=gen) + 0.2) * torch.sign(torch.randn(48, generator=gen))).to(device, dtype)
    x = (torch.randn(6, 48, generator=gen) * 2).to(device, dtype).requires_grad_()
    grad = torch.randn(6, 48, generator=gen).to(device, dtype)
    (want_dx,) = torch.autograd.grad(rms_norm(x, weight, 1e-6), x, grad)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = rms_norm(x, weight, 1e-6, keep_output=True)
    (got_dx,) = torch.autograd.grad(y, x, grad)
    torch.testing.assert_close(got_dx, want_dx, rtol=tol, atol=tol)
    storages = {t.untyped_storage().data_ptr() for t in kept}
    assert y.untyped_storage().data_ptr() in storages and x.untyped_storage().data_ptr() not in storages
    assert sum(t.numel() for t in kept if t.untyped_storage().data_ptr() not in
               {y.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr()}) == 6  # one scale per row


def test_the_layers_two_norms_work_from_their_output_unless_a_weight_is_zero(tiny_model):
    from training.norms import KEEP_OUTPUT_ATTRIBUTE, _fused_forward

    with torch.no_grad():
        tiny_model.model.layers[1].post_attention_layernorm.weight[3] = 0
    use_fused_rms_norms(tiny_model)
    norms = {name: module for name, module in tiny_model.named_modules() if KEEP_OUTPUT_ATTRIBUTE in module.__dict__}
    # decided at the first forward (the weights may not be loaded when the norms switch)
    for name in ("model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm"):
        assert norms[name].__dict__[KEEP_OUTPUT_ATTRIBUTE] is None
        _fused_forward(norms[name], torch.randn(2, 3, tiny_model.config.hidden_size))
    assert norms["model.layers.0.input_layernorm"].__dict__[KEEP_OUTPUT_ATTRIBUTE] is True
    assert norms["model.layers.1.post_attention_layernorm"].__dict__[KEEP_OUTPUT_ATTRIBUTE] is False  # column 3
    others = ("model.layers.0.self_attn.q_norm", "model.layers.0.self_attn.k_norm", "model.norm")
    assert all(norms[name].__dict__[KEEP_OUTPUT_ATTRIBUTE] is False for name in others)


def _weight(size, gen, dtype):
    return ((torch.rand(size, generator=gen) - 0.5) * 0.6).to(dtype)  # Qwen3.5's are centred on 0 (and 1 + w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("keep_output", [False, True])
def test_it_computes_qwen3_5s_zero_centred_rmsnorm_and_its_input_gradient(dtype, keep_output):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm

    gen = torch.Generator().manual_seed(2)
    norm = Qwen3_5MoeRMSNorm(40, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(_weight(40, gen, torch.float32))
    norm = norm.to(dtype).requires_grad_(False)
    x = (torch.randn(3, 5, 40, generator=gen) * 3).to(dtype).requires_grad_()
    grad = torch.randn(3, 5, 40, generator=gen).to(dtype)
    want = norm(x)
    (want_dx,) = torch.autograd.grad(want, x, grad)
    got = rms_norm(x, norm.weight, norm.eps, keep_output=keep_output, zero_centered=True)
    (got_dx,) = torch.autograd.grad(got, x, grad)
    assert got.dtype == want.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=4e-3)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_dx, want_dx, **tol)
    # the standard norm's rounding is not this one: the test tells them apart
    plain = rms_norm(x, norm.weight + 1, norm.eps)
    assert dtype != torch.float16 or not torch.equal(plain, want)


@pytest.mark.parametrize("dtype, tol, device", INTERPRETER_AND_GPU)
def test_the_gated_norm_is_transformers_and_keeps_only_its_two_inputs(dtype, tol, device):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNormGated

    from training.kernels.gated_rmsnorm import gated_rms_norm

    gen = torch.Generator().manual_seed(3)
    norm = Qwen3_5MoeRMSNormGated(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32, generator=gen) + 0.5)
    norm = norm.to(device, dtype).requires_grad_(False)
    x = (torch.randn(24, 32, generator=gen) * 2).to(device, dtype).requires_grad_()
    gate = (torch.randn(24, 32, generator=gen) * 2).to(device, dtype).requires_grad_()
    grad = torch.randn(24, 32, generator=gen).to(device, dtype)
    want = norm(x, gate)
    want_dx, want_dgate = torch.autograd.grad(want, (x, gate), grad)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        got = gated_rms_norm(x, gate, norm.weight, norm.variance_epsilon)
    got_dx, got_dgate = torch.autograd.grad(got, (x, gate), grad)
    assert got.dtype == want.dtype == dtype
    for have, expected in ((got, want), (got_dx, want_dx), (got_dgate, want_dgate)):
        torch.testing.assert_close(have, expected, rtol=tol, atol=tol)
    assert {t.untyped_storage().data_ptr() for t in kept} == {
        t.untyped_storage().data_ptr() for t in (x, gate, norm.weight)}


def test_a_qwen3_5_models_norms_switch_and_keep_their_state():
    from training.examples.tiny import TINY_QWEN3_5_CONFIG
    from training.recipe import ModelSettings
    from training.train import build_model

    model = build_model(ModelSettings(config=TINY_QWEN3_5_CONFIG, dtype="float32"), torch.device("cpu"))
    tokens = torch.randint(0, model.config.get_text_config().vocab_size, (2, 12))
    keys = set(model.state_dict())
    want = model(input_ids=tokens).logits
    switched = use_fused_rms_norms(model)
    names = {type(m).__name__ for m in model.modules()}
    assert {"FusedQwen3_5MoeRMSNorm", "FusedQwen3_5MoeRMSNormGated"} <= names
    layers = model.config.get_text_config().layer_types
    attention, deltanet = layers.count("full_attention"), layers.count("linear_attention")
    # per layer: input and post-attention norms; attention's q and k norms; DeltaNet's gated one; the final norm
    assert switched == 2 * len(layers) + 2 * attention + deltanet + 1
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(model(input_ids=tokens).logits, want)  # on the CPU the classes' own forward
