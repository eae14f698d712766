"""The fused attention LoRA forward against peft's own, on the same peft layer."""

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from training.lora_linear import LoraLinear


def _layer(dtype, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    holder = torch.nn.Module()
    holder.q_proj = torch.nn.Linear(24, 40, bias=True)
    holder = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj"]),
                                     holder)
    holder.to(dtype)
    layer = holder.q_proj
    layer.base_layer.requires_grad_(False)
    with torch.no_grad():  # B starts at zero; give it values so the adapter's term counts
        layer.lora_B["default"].weight.normal_(0, 0.5)
        # peft's own setup keeps adapters in float32 over a half-precision model
        layer.lora_A["default"].float()
        layer.lora_B["default"].float()
    return layer


def _run(layer, x, grad):
    x = x.detach().requires_grad_()
    y = layer(x)
    params = [layer.lora_A["default"].weight, layer.lora_B["default"].weight]
    grads = torch.autograd.grad(y, [x] + params, grad)
    return y.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_computes_what_pefts_forward_computes(dtype):
    layer = _layer(dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 24, generator=gen).to(dtype)
    grad = torch.randn(3, 5, 40, generator=gen).to(dtype)
    want, want_grads = _run(layer, x, grad)  # peft's Linear
    LoraLinear.adopt(layer)
    assert type(layer) is LoraLinear
    got, got_grads = _run(layer, x, grad)
    assert got.dtype == want.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, g, w in zip(("y", "dx", "dA", "dB"), (got,) + got_grads, (want,) + want_grads, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert float((g.float() - w.float()).norm() / w.float().norm()) < tol, name


def test_it_leaves_what_it_does_not_fuse_to_peft(monkeypatch):
    layer = LoraLinear.adopt(_layer(torch.float32, dropout=0.1))
    assert layer._fused_adapter() is None  # dropout: peft's forward runs
    layer = LoraLinear.adopt(_layer(torch.float32))
    assert layer._fused_adapter() is not None
    layer.base_layer.weight.requires_grad_(True)
    assert layer._fused_adapter() is None  # a trainable base gets its gradient from peft's path
    layer.base_layer.weight.requires_grad_(False)
    with _disabled(layer):  # adapters off: the base alone
        x = torch.randn(2, 24)
        torch.testing.assert_close(layer(x), layer.base_layer(x))


class _disabled:
    def __init__(self, layer):
        self.layer = layer

    def __enter__(self):
        self.layer.enable_adapters(False)

    def __exit__(self, *exc):
        self.layer.enable_adapters(True)
