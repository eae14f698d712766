"""Packed rows: several samples in one row of seq_len tokens, kept apart in the forward.

Each sample's positions restart at 0 (`position_ids`), from which transformers builds a block-diagonal causal mask
for the attention layers (with no attention mask and no cache); the DeltaNet layers of a hybrid family also get the
sample boundaries over the batch flattened into one stream (`cu_seq_lens_q`, transformers' name for them; see
training/linear_attention.py). Finding the boundaries reads them on the host, so only families with linear
attention pay for it.
"""

import torch

from training import families


def row_positions(lengths):
    """Position ids of one row made of samples of these lengths: 0 .. n-1 for each."""
    return [i for n in lengths for i in range(n)]


def boundaries(position_ids):
    """transformers' packed-sequence arguments for (B, L) position ids: cumulative sample ends over the flattened
    rows (every row starts a sample, so a sample never runs from one row into the next)."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    ends = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    longest = int((ends[1:] - ends[:-1]).max())
    return {"cu_seq_lens_q": ends, "cu_seq_lens_k": ends, "max_length_q": longest, "max_length_k": longest}


def needs_boundaries(model) -> bool:
    family = families.find_family(getattr(model, "config", None))
    return family is not None and family.linear_attention


def model_inputs(model, batch):
    """The forward's arguments for a CPT/SFT micro-batch: packed rows with their positions where the batch has them."""
    inputs = {"input_ids": batch["input_ids"], "use_cache": False}
    position_ids = batch.get("position_ids")
    if position_ids is not None:
        inputs["position_ids"] = position_ids
        if needs_boundaries(model):
            inputs.update(boundaries(position_ids))
    return inputs
