"""Gated DeltaNet layers (Qwen3.5/3.6-MoE, Qwen3-Next) on packed rows: each sample's recurrent state and short
convolution start from zero at its first token.

transformers' reference DeltaNet (no flash-linear-attention, no causal-conv1d) runs one recurrence over the whole
row and refuses the sample boundaries (`cu_seqlens`); so where the forward is given them (`cu_seq_lens_q`, over the
batch flattened into one stream, see training/packing.py) the layer runs once per sample and the outputs are put
back in place. The attention layers keep samples apart through per-sample `position_ids` (transformers builds the
block-diagonal causal mask from them). Which DeltaNet kernels transformers resolved is reported by `deltanet_path`.
"""

import importlib.util

import torch

from training.class_switch import original_class, switch_class

DELTANET_CLASSES = ("Qwen3_5MoeGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3NextGatedDeltaNet")
BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _segmented_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    ends = kwargs["cu_seq_lens_q"].tolist()
    for key in BOUNDARY_KWARGS:
        kwargs.pop(key, None)
    forward = original_class(self).forward
    batch, length, width = hidden_states.shape
    stream = hidden_states.reshape(1, batch * length, width)
    parts = [forward(self, stream[:, start:end], cache=None, attention_mask=None, **kwargs)
             for start, end in zip(ends[:-1], ends[1:]) if end > start]
    return torch.cat(parts, dim=1).view(batch, length, -1)


def _applies(self, hidden_states=None, cache=None, attention_mask=None, **kwargs):
    return kwargs.get("cu_seq_lens_q") is not None and cache is None and attention_mask is None


def use_segmented_linear_attention(model):
    """Switch every Gated DeltaNet layer of the model to keep packed samples apart; returns how many were switched."""
    switched = 0
    for module in model.modules():
        if type(module).__name__ in DELTANET_CLASSES:
            switch_class(module, _segmented_forward, _applies)
            switched += 1
    return switched


def deltanet_path() -> str:
    """"fla" when flash-linear-attention is importable (transformers then runs its chunked kernel), else
    "reference" (transformers' PyTorch code); "+causal-conv1d" when the short convolution has its kernel too."""
    chunk = "fla" if importlib.util.find_spec("fla") is not None else "reference"
    conv = "+causal-conv1d" if importlib.util.find_spec("causal_conv1d") is not None else ""
    return chunk + conv
