"""Gated DeltaNet layers (Qwen3.5/3.6-MoE, Qwen3-Next) on packed rows: each sample's recurrent state and short
convolution start from zero (docs/training.md, "training/linear_attention.py")."""

import functools
import importlib
import importlib.util
from itertools import pairwise

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from training.class_switch import original_class, switch_class

DELTANET_CLASSES = ("Qwen3_5MoeGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3NextGatedDeltaNet")
BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "sample_ends")
KERNEL_DEVICE_TYPES = ("cuda",)  # where FLA's Triton and causal-conv1d's CUDA kernels run


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


def _applies(self, hidden_states=None, attention_mask=None, **kwargs):
    return kwargs.get("cu_seq_lens_q") is not None and _cache_of(kwargs) is None and attention_mask is None


def _packed_forward(self, hidden_states, attention_mask=None, **kwargs):
    ends = kwargs.get("sample_ends") or tuple(kwargs["cu_seq_lens_q"].tolist())
    chunk_rule = fla_chunk_rule()
    if chunk_rule is not None and hidden_states.device.type in KERNEL_DEVICE_TYPES:
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
    width = weight.shape[-1]
    parts = []
    for start, end in pairwise(ends):
        if end > start:
            part = mixed[:, :, start:end].to(weight.dtype)
            parts.append(F.conv1d(part, weight[:, None], layer.conv1d.bias, padding=width - 1,
                                  groups=weight.shape[0])[:, :, :end - start])
    out = torch.cat(parts, dim=2)
    return (ACT2FN[layer.activation](out) if layer.activation else out).to(mixed.dtype)


def fast_packed_forward(layer, hidden_states, ends, chunk_rule):
    """The whole flattened stream through the layer in one pass, FLA's kernel told the sample boundaries."""
    batch, length, width = hidden_states.shape
    stream = hidden_states.reshape(1, batch * length, width)
    total = stream.shape[1]
    mixed, z, b, a = _projections(layer, stream)
    mixed = short_convolution(layer, mixed, ends).transpose(1, 2)
    query, key, value = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    # q and k keep their num_k_heads: FLA maps value head h to key head h // (HV // H), as repeat_interleave does.
    query = query.reshape(1, total, -1, layer.head_k_dim)
    key = key.reshape(1, total, -1, layer.head_k_dim)
    value = value.reshape(1, total, -1, layer.head_v_dim)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)  # as transformers: float32 decay
    host = torch.tensor(ends, dtype=torch.long)
    out, _ = chunk_rule(query, key, value, g=g, beta=beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=True, cu_seqlens=host.to(stream.device, non_blocking=True),
                        cu_seqlens_cpu=host)
    out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(out.reshape(batch, length, -1))


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
    "reference" (transformers' PyTorch code, packed rows one sample at a time); "+causal-conv1d" when the short
    convolution has its kernel too."""
    chunk = "fla" if importlib.util.find_spec("fla") is not None else "reference"
    conv = "+causal-conv1d" if importlib.util.find_spec("causal_conv1d") is not None else ""
    return chunk + conv
