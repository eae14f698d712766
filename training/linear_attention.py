"""Gated DeltaNet layers (Qwen3.5/3.6-MoE, Qwen3-Next) on packed rows: each sample's recurrent state and short
convolution start from zero (docs/training.md, "training/linear_attention.py")."""

import functools
import importlib
import importlib.util
import inspect
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers.activations import ACT2FN

from training.attention import ROWS_KEY
from training.class_switch import original_class, switch_class

DELTANET_CLASSES = ("Qwen3_5MoeGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3NextGatedDeltaNet")
BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "sample_ends")
KERNEL_DEVICE_TYPES = ("cuda",)  # where FLA's Triton and causal-conv1d's CUDA kernels run
# The log decay a sample's first token takes on the device path: the state carried from the sample before is scaled
# by exp(-30) = 9e-14, nothing at bf16's (or float32's) precision, and nothing else reads that token's decay.
RESET_DECAY = -30.0


@functools.cache
def fla_chunk_rule():
    """FLA's chunked gated delta rule, or None where flash-linear-attention is not installed."""
    try:
        return importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule
    except ImportError:
        return None


@functools.cache
def conv1d_kernel():
    """causal-conv1d's `causal_conv1d_fn` (it keeps samples apart with `seq_idx`), or None where it is missing."""
    try:
        return importlib.import_module("causal_conv1d").causal_conv1d_fn
    except ImportError:
        return None


def _cache_of(kwargs):
    # transformers renamed the layer's cache argument (cache_params -> cache); either may come.
    return kwargs.get("cache", kwargs.get("cache_params"))


def _device_ends(kwargs):
    """The padded device boundaries the trainer's packed rows carry (training/attention.py RowSegments), or None."""
    rows = kwargs.get(ROWS_KEY)
    return getattr(rows, "cu_seq_lens", None)


def _whole_rows(kwargs):
    """The trainer said its rows are whole, unmasked samples (RowSegments.whole_rows)."""
    rows = kwargs.get(ROWS_KEY)
    return rows is not None and rows.cu_seq_lens is None


def _applies(self, hidden_states=None, attention_mask=None, **kwargs):
    packed = kwargs.get("cu_seq_lens_q") is not None or _device_ends(kwargs) is not None or _whole_rows(kwargs)
    return packed and _cache_of(kwargs) is None and attention_mask is None


def _packed_forward(self, hidden_states, attention_mask=None, **kwargs):
    chunk_rule = fla_chunk_rule() if hidden_states.device.type in KERNEL_DEVICE_TYPES else None
    cu = _device_ends(kwargs)
    if cu is None and _whole_rows(kwargs):  # each row one sample: its start made from the shape alone
        length = hidden_states.shape[1]
        cu = torch.arange(0, hidden_states.shape[0] * length + 1, length, device=hidden_states.device)
    if cu is not None:
        return device_packed_forward(self, hidden_states, cu, chunk_rule or torch_chunk_rule)
    ends = kwargs.get("sample_ends") or tuple(kwargs["cu_seq_lens_q"].tolist())
    if chunk_rule is not None:
        return fast_packed_forward(self, hidden_states, ends, chunk_rule)
    return reference_packed_forward(self, hidden_states, ends, **kwargs)


def reference_packed_forward(layer, hidden_states, ends, **kwargs):
    """The layer's own forward once per sample of the flattened stream; (B, L, hidden) out."""
    kwargs = {key: value for key, value in kwargs.items() if key not in BOUNDARY_KWARGS}
    kwargs.pop("cache", None)
    kwargs.pop("cache_params", None)
    forward = original_class(layer).forward
    batch, length, width = hidden_states.shape
    stream = hidden_states.reshape(1, batch * length, width)
    parts = [forward(layer, stream[:, start:end], attention_mask=None, **kwargs)
             for start, end in pairwise(ends) if end > start]
    return torch.cat(parts, dim=1).view(batch, length, -1)


def _projections(layer, stream):
    """What the layer's forward makes of its input before the convolution: mixed q|k|v (1, conv_dim, T), the gate
    input z (1, T, HV, Dv), and b, a (1, T, HV)."""
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: heads interleaved in two fused projections
        query, key, value, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(stream),
                                                                         layer.in_proj_ba(stream))
        mixed = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value)], dim=-1)
    else:
        mixed = layer.in_proj_qkv(stream)
        z = layer.in_proj_z(stream).reshape(1, stream.shape[1], -1, layer.head_v_dim)
        b, a = layer.in_proj_b(stream), layer.in_proj_a(stream)
    return mixed.transpose(1, 2), z, b, a


def short_convolution(layer, mixed, ends):
    """The layer's depthwise causal conv1d and activation over (1, D, T), never reaching across a sample start."""
    weight = layer.conv1d.weight.squeeze(1)
    kernel = conv1d_kernel()
    if kernel is not None and mixed.device.type in KERNEL_DEVICE_TYPES:
        lengths = torch.tensor(ends[1:]) - torch.tensor(ends[:-1])
        seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)
        # seq_idx needs the channel-last layout, which the projection's transpose already is.
        return kernel(mixed, weight, layer.conv1d.bias, seq_idx=seq_idx[None].to(mixed.device, non_blocking=True),
                      activation=layer.activation)
    return remade_in_backward(_per_sample_convolution, layer, mixed, ends)


def _per_sample_convolution(layer, mixed, ends):
    weight = layer.conv1d.weight.squeeze(1)
    width = weight.shape[-1]
    parts = []
    for start, end in pairwise(ends):
        if end > start:
            part = mixed[:, :, start:end].to(weight.dtype)
            parts.append(F.conv1d(part, weight[:, None], layer.conv1d.bias, padding=width - 1,
                                  groups=weight.shape[0])[:, :, :end - start])
    out = torch.cat(parts, dim=2)
    return (ACT2FN[layer.activation](out) if layer.activation else out).to(mixed.dtype)


def remade_in_backward(convolution, layer, mixed, boundaries):
    """`convolution(layer, mixed, boundaries)`, made again in the backward from `mixed` instead of keeping its result
    and its activation's input (nothing random in it: no RNG state)."""
    if not torch.is_grad_enabled():
        return convolution(layer, mixed, boundaries)
    return checkpoint(convolution, layer, mixed, boundaries, use_reentrant=False, preserve_rng_state=False)


def _one_pass(layer, hidden_states, convolve, chunk_rule, starts=None, **boundaries):
    """The flattened stream through the layer in one pass: `convolve` keeps the short convolution to each sample, and
    the chunked rule the state, told the `boundaries` or, with `starts`, emptying it there (RESET_DECAY)."""
    batch, length, width = hidden_states.shape
    stream = hidden_states.reshape(1, batch * length, width)
    total = stream.shape[1]
    mixed, z, b, a = _projections(layer, stream)
    mixed = convolve(mixed).transpose(1, 2)
    query, key, value = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    # q and k keep their num_k_heads: FLA maps value head h to key head h // (HV // H), as repeat_interleave does.
    query = query.reshape(1, total, -1, layer.head_k_dim)
    key = key.reshape(1, total, -1, layer.head_k_dim)
    value = value.reshape(1, total, -1, layer.head_v_dim)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)  # as transformers: float32 decay
    if starts is not None:
        g = torch.where(starts[None, :, None], RESET_DECAY, g)
    out, _ = chunk_rule(query, key, value, g=g, beta=beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=True, **boundaries)
    out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(out.reshape(batch, length, -1))


def fast_packed_forward(layer, hidden_states, ends, chunk_rule):
    """The whole flattened stream through the layer in one pass, FLA's kernel told the sample boundaries."""
    host = torch.tensor(ends, dtype=torch.long)
    return _one_pass(layer, hidden_states, lambda mixed: short_convolution(layer, mixed, ends), chunk_rule,
                     cu_seqlens=host.to(hidden_states.device, non_blocking=True), cu_seqlens_cpu=host)


def torch_chunk_rule(q, k, v, g, beta, **kwargs):
    """transformers' PyTorch chunked gated delta rule with FLA's call (q and k keep their key heads, value head h
    reads key head h // (HV // H)): the device path's rule where FLA's kernels do not run."""
    groups = v.shape[2] // q.shape[2]
    q, k = (x.repeat_interleave(groups, dim=2) for x in (q, k))
    return pytorch_chunk_rule()(q, k, v, g=g, beta=beta, **kwargs)


@functools.cache
def pytorch_chunk_rule():
    """transformers' own PyTorch chunked gated delta rule: its module's name, unwrapped, resolves to FLA's kernel
    where FLA is installed."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    return inspect.unwrap(modeling_qwen3_5_moe.torch_chunk_gated_delta_rule)


def sample_starts(cu, total):
    """(total,) bool, on the device: the tokens that begin a sample, from boundaries padded with `total`."""
    flags = torch.zeros(total + 1, dtype=torch.bool, device=cu.device)
    # the padding's entries land on the extra slot; index_fill_, not `flags[index] = True`, which copies the value
    # in from the host (a 0-dim CPU tensor), an error under a CUDA graph's capture
    return flags.index_fill_(0, cu[:-1].long(), True)[:total]


def rows_short_convolution(layer, mixed, cu, starts):
    """The layer's depthwise causal conv1d and activation over (1, D, T), never reaching across a sample start,
    with no host value: causal-conv1d told each token's sample where it is installed, else our Triton kernel told
    each sample's first token (`starts`; a frozen convolution), else `leak_corrected_convolution`."""
    weight = layer.conv1d.weight.squeeze(1)  # (D, width); tap j reads the token width - 1 - j back
    kernel = conv1d_kernel()
    on_device = mixed.device.type in KERNEL_DEVICE_TYPES
    if kernel is not None and on_device:
        seq_idx = starts.cumsum(0, dtype=torch.int32) - 1
        return kernel(mixed, weight, layer.conv1d.bias, seq_idx=seq_idx[None], activation=layer.activation)
    silu = layer.activation in ("silu", "swish")
    if on_device and not weight.requires_grad and (silu or not layer.activation):
        from training.kernels.short_conv import short_conv

        out = short_conv(mixed[0].transpose(0, 1), starts, weight, layer.conv1d.bias, silu)
        return out.transpose(0, 1)[None]
    return remade_in_backward(leak_corrected_convolution, layer, mixed, cu)


def leak_corrected_convolution(layer, mixed, cu):
    """PyTorch's conv1d and the activation over the whole stream (1, D, T), less what the first taps of each sample
    read of the sample before (gathered at a fixed size from the padded boundaries `cu`)."""
    total = mixed.shape[-1]
    weight = layer.conv1d.weight.squeeze(1)
    width = weight.shape[-1]
    out = F.conv1d(mixed.to(weight.dtype), weight[:, None], layer.conv1d.bias, padding=width - 1,
                   groups=weight.shape[0])[:, :, :total]
    starts, nexts = cu[:-1].long(), cu[1:].long()
    # (sample, offset d into it, lag s > d): the tap of lag s at the sample's token d reads the sample before (made
    # on the device: a host list copied in would break a CUDA graph's capture)
    offsets, lags = torch.triu_indices(width, width, offset=1, device=cu.device)
    at = starts[:, None] + offsets  # (samples, pairs)
    source = at - lags
    valid = (at < nexts[:, None]) & (source >= 0)
    read = mixed[0][:, source.clamp(0, total - 1).flatten()].view(-1, *at.shape)  # (D, samples, pairs)
    taps = weight[:, width - 1 - lags]  # (D, pairs)
    leak = (read.float() * taps.float()[:, None, :] * valid).to(out.dtype)
    out = out.index_add(2, at.clamp(0, total - 1).flatten(), -leak.view(1, -1, at.numel()))
    return (ACT2FN[layer.activation](out) if layer.activation else out).to(mixed.dtype)


def device_packed_forward(layer, hidden_states, cu, chunk_rule):
    """The whole flattened stream through the layer in one pass with no host value, so a CUDA graph can hold it:
    each sample's first token takes a decay of RESET_DECAY, emptying the state it inherits, and the short convolution
    keeps to each sample (docs/training.md). `cu`: the boundaries over the stream, padded with its token count."""
    starts = sample_starts(cu, hidden_states.shape[0] * hidden_states.shape[1])  # the decay's and the convolution's
    return _one_pass(layer, hidden_states, lambda mixed: rows_short_convolution(layer, mixed, cu, starts), chunk_rule,
                     starts)


def use_segmented_linear_attention(model):
    """Switch every Gated DeltaNet layer of the model to keep packed samples apart; returns how many were switched."""
    switched = 0
    for module in model.modules():
        if type(module).__name__ in DELTANET_CLASSES:
            switch_class(module, _packed_forward, _applies)
            switched += 1
    return switched


def deltanet_path() -> str:
    """"fla" when flash-linear-attention is importable (its chunked kernel runs, packed rows in one call), else
    "reference" (transformers' PyTorch rule); "+causal-conv1d" when the short convolution has its kernel too."""
    chunk = "fla" if importlib.util.find_spec("fla") is not None else "reference"
    conv = "+causal-conv1d" if importlib.util.find_spec("causal_conv1d") is not None else ""
    return chunk + conv
