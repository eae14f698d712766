"""The DeltaNet short convolution's Triton kernels (Triton's interpreter on the CPU) against PyTorch's conv1d run on
each packed sample alone, and the device path that takes them."""

import pytest
import torch
import torch.nn.functional as F

from tests.training.kernel_dtypes import INTERPRETER_AND_GPU
from training import linear_attention
from training.kernels.short_conv import ShortConvFunction, short_conv

# Samples of 1 and 2 tokens (shorter than the convolution), a long one, and tokens after the last start
LENGTHS = (1, 2, 5, 3, 40, 1, 9)


def _starts(lengths):
    starts = torch.zeros(sum(lengths), dtype=torch.bool)
    starts[torch.tensor((0, *lengths[:-1])).cumsum(0)] = True
    return starts


def _per_sample(x, lengths, weight, bias, silu):
    """(tokens, channels) through conv1d one sample at a time: the truth."""
    width, parts, start = weight.shape[-1], [], 0
    for n in lengths:
        part = x[start:start + n].t()[None]
        out = F.conv1d(part, weight[:, None], bias, padding=width - 1, groups=weight.shape[0])[..., :n]
        parts.append((F.silu(out) if silu else out)[0].t())
        start += n
    return torch.cat(parts)


@pytest.mark.parametrize("dtype, tol, device", INTERPRETER_AND_GPU)
@pytest.mark.parametrize("bias, silu", [(False, True), (True, True), (True, False)])
def test_it_convolves_each_sample_alone_and_gives_its_input_gradient(dtype, tol, device, bias, silu):
    gen = torch.Generator().manual_seed(0)
    channels = 40  # not a multiple of the kernel's channel block
    x = torch.randn(sum(LENGTHS), channels, generator=gen).to(device, dtype).requires_grad_()
    weight = (torch.randn(channels, 4, generator=gen) * 0.5).to(device, dtype)
    b = (torch.randn(channels, generator=gen) * 0.1).to(device, dtype) if bias else None
    grad = torch.randn(x.shape, generator=gen).to(device, dtype)
    want = _per_sample(x, LENGTHS, weight, b, silu)
    (want_dx,) = torch.autograd.grad(want, x, grad)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        got = short_conv(x, _starts(LENGTHS).to(device), weight[:, None], b, silu)
    (got_dx,) = torch.autograd.grad(got, x, grad)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_dx, want_dx, rtol=tol, atol=tol)
    # of the activations, only the input is kept (beside the sample starts, a byte a token)
    wide = [t for t in kept if t.dim() == 2 and t.shape[0] == x.shape[0]]
    assert [t.untyped_storage().data_ptr() for t in wide] == [x.untyped_storage().data_ptr()]
    # run as one sample, the convolution reaches across: the test can tell
    one = short_conv(x.detach(), torch.arange(x.shape[0], device=device) == 0, weight, b, silu)
    assert (one - want).abs().max() > 1e-2


def test_the_device_path_takes_it_for_a_frozen_convolution(monkeypatch):
    from transformers import AutoConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    from training.examples.tiny import TINY_QWEN3_5_CONFIG

    fields = {key: value for key, value in TINY_QWEN3_5_CONFIG.items() if key != "model_type"}
    torch.manual_seed(0)
    layer = Qwen3_5MoeGatedDeltaNet(AutoConfig.for_model("qwen3_5_moe_text", **fields), 0).requires_grad_(False)
    channels, total = layer.conv1d.weight.shape[0], sum(LENGTHS)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist(), total, total])  # padded, as the rows carry them
    mixed = torch.randn(1, total, channels).transpose(1, 2).requires_grad_()  # (1, D, T), the projection's layout
    want = linear_attention.leak_corrected_convolution(layer, mixed, cu)
    calls = []
    monkeypatch.setattr(linear_attention, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))  # the interpreter plays the GPU
    forward = ShortConvFunction.forward
    monkeypatch.setattr(ShortConvFunction, "forward", staticmethod(lambda *args: calls.append(1) or forward(*args)))
    got = linear_attention.rows_short_convolution(layer, mixed, cu, linear_attention.sample_starts(cu, total))
    assert calls and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (want_dx,) = torch.autograd.grad(want, mixed, torch.ones_like(want))
    (got_dx,) = torch.autograd.grad(got, mixed, torch.ones_like(got))
    torch.testing.assert_close(got_dx, want_dx, rtol=1e-5, atol=1e-5)

