"""Causal attention over whole or packed rows without a (batch, 1, L, L) mask: the trainer says what its rows are, so
SDPA runs causal or flash attention runs per sample (docs/training.md, "training/attention.py")."""

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "packed_sdpa"
# Text decoders whose masks are causal (and packed-causal) only, with no overlay such as vision tokens', and whose
# decoder layers hand their attention the positions (the fallback for packed positions reads them).
FAMILIES = ("qwen3_moe", "qwen2_moe", "qwen3", "qwen3_5_moe_text")
ROWS_KEY = "row_segments"  # the forward's keyword argument that carries a RowSegments


@dataclass(frozen=True)
class RowSegments:
    cu_seq_lens: torch.Tensor | None = None  # None: whole rows

    @classmethod
    def whole_rows(cls):
        return cls(None)


def _mask(**kwargs):
    """No mask where rows need none but causality and their own samples (the attention keeps those apart);
    transformers' SDPA mask otherwise."""
    plain = (kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
             and isinstance(kwargs.get("q_offset", 0), int) and kwargs.get("q_offset", 0) == 0
             and kwargs.get("kv_offset", 0) == 0 and kwargs.get("q_length") == kwargs.get("kv_length"))
    return None if plain else sdpa_mask(**kwargs)


def _document_mask(segment_ids):
    """(B, 1, L, L) bool: causal, and within one sample, from (B, L) sample ids."""
    length = segment_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    return (causal & (segment_ids[:, :, None] == segment_ids[:, None, :]))[:, None]


def _segment_ids_from_boundaries(cu, batch, length):
    tokens = torch.arange(batch * length, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu, tokens, right=True).view(batch, length)


def _segment_ids_from_positions(position_ids):
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


def _flash_covers(query, key, dropout):
    return (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and dropout == 0.0
            and query.shape[-1] <= 256 and query.shape[-1] % 8 == 0 and query.shape[1] % key.shape[1] == 0
            and torch.cuda.get_device_capability(query.device)[0] >= 8)


class _VarlenCausal(torch.autograd.Function):
    """Flash attention's variable-length kernels, causal within each sample: (T, H, D) in, (T, Hq, D) out."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_len, ctx.max_len, 0.0, True, rng, unused,
            scale=ctx.scale)
        return dq, dk, dv, None, None, None


def _varlen(query, key, value, cu, scaling):
    """(B, H, L, D) in; (B, L, H, D) out, as transformers' attention functions return it."""
    batch, heads, length, dim = query.shape
    flat = [t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value)]
    out = _VarlenCausal.apply(*flat, cu, length, scaling)
    return out.view(batch, length, heads, dim)


def packed_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    rows = kwargs.get(ROWS_KEY)
    plain = attention_mask is None and query.shape[2] == key.shape[2] > 1
    if plain and rows is not None and rows.cu_seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    if plain and rows is not None:
        if _flash_covers(query, key, dropout):
            return _varlen(query, key, value, rows.cu_seq_lens, scaling), None
        attention_mask = _document_mask(_segment_ids_from_boundaries(rows.cu_seq_lens, query.shape[0],
                                                                     query.shape[2]))
    elif plain and kwargs.get("position_ids") is not None:  # a caller's positions: transformers' own rule
        segments = _segment_ids_from_positions(kwargs["position_ids"].expand(query.shape[0], -1))
        capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()  # no host read then
        if capturing or bool((segments[:, -1] != 0).any()):
            attention_mask = _document_mask(segments)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


AttentionInterface.register(NAME, packed_sdpa_attention)
AttentionMaskInterface.register(NAME, _mask)


def use_packed_attention(model) -> bool:
    """Switch a listed family's SDPA attention to "packed_sdpa"; returns whether it did."""
    config = model.config
    if config.model_type in FAMILIES and config._attn_implementation == "sdpa":
        config._attn_implementation = NAME
    return uses_packed_attention(model)


def uses_packed_attention(model) -> bool:
    return getattr(model, "config", None) is not None and model.config._attn_implementation == NAME
