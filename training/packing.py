"""Packed rows: several samples in one row of seq_len tokens, kept apart in the forward (docs/training.md,
"training/packing.py")."""

from itertools import pairwise

import torch

from training import families
from training.attention import ROWS_KEY, RowSegments, uses_packed_attention


def row_positions(lengths):
    """Position ids of one row made of samples of these lengths: 0 .. n-1 for each."""
    return [i for n in lengths for i in range(n)]


def sample_starts(row):
    """Where the samples of one row of host position ids start: at the row's start and wherever a position does not
    follow the one before (transformers' packed-sequence rule)."""
    return [i for i, p in enumerate(row) if i == 0 or p != row[i - 1] + 1]


def sample_ends(position_ids):
    """The cumulative sample boundaries over the flattened rows of host position ids (a list of rows): 0, the end of
    each sample, ..., the token count."""
    starts, offset = [], 0
    for row in position_ids:
        starts += [offset + i for i in sample_starts(row)]
        offset += len(row)
    return starts + [offset]


def cu_seq_lens(position_ids, width=None):
    """`sample_ends` as an int32 tensor padded with the token count to `width` entries (default: the next power of
    two): what the attention keeps samples apart by (training/attention.py RowSegments)."""
    ends = sample_ends(position_ids)
    offset = ends[-1]
    width = width or 1 << (len(ends) - 1).bit_length()
    if width < len(ends):
        raise ValueError(f"{len(ends) - 1} samples do not fit {width - 1} boundaries")
    return torch.tensor(ends + [offset] * (width - len(ends)), dtype=torch.int32)


def boundaries(position_ids, ends=None, device_ends=None):
    """transformers' packed-sequence arguments for (B, L) position ids: cumulative sample ends, on the device and on the
    host (docs/training.md, "training/packing.py")."""
    if ends is None:
        ends = tuple(sample_ends(position_ids.cpu().tolist()))
        device_ends = torch.tensor(ends, dtype=torch.int32).to(position_ids.device, non_blocking=True)
    else:  # without the padding after the last sample: FLA and transformers take the exact boundaries
        device_ends = device_ends[: len(ends)]
    longest = max(end - start for start, end in pairwise(ends))
    return {"cu_seq_lens_q": device_ends, "cu_seq_lens_k": device_ends, "max_length_q": longest,
            "max_length_k": longest, "sample_ends": ends}


def needs_boundaries(model) -> bool:
    """Whether the model's DeltaNet layers take packed rows' boundaries as transformers' arguments and on the host:
    a family with linear attention whose attention is not told its rows (training/attention.py). Where it is, its
    DeltaNet layers read the same device boundaries (training/linear_attention.py) and the batch stays all
    tensors, as CUDA graphs take it."""
    family = families.find_family(getattr(model, "config", None))
    return family is not None and family.linear_attention and not uses_packed_attention(model)


def with_host_ends(model, batch):
    """The host micro-batch, with its packed rows' `sample_ends` where the model's layers need them on the host (the
    families with linear attention; the others' batches stay all tensors, as CUDA graphs take them): its
    `cu_seq_lens` without the padding (the ends rise until the token count, which the padding repeats)."""
    if "cu_seq_lens" in batch and needs_boundaries(model):
        batch["sample_ends"] = tuple(torch.unique_consecutive(batch["cu_seq_lens"]).tolist())
    return batch


def model_inputs(model, batch):
    """The forward's arguments for a micro-batch: packed rows with their positions where the batch has them (CPT,
    SFT), right-padded rows with their attention mask where it has one (DPO, KTO, GRPO)."""
    inputs = {"input_ids": batch["input_ids"], "use_cache": False}
    if "attention_mask" in batch:
        inputs["attention_mask"] = batch["attention_mask"]
    position_ids = batch.get("position_ids")
    if position_ids is not None:
        inputs["position_ids"] = position_ids
        if needs_boundaries(model):
            inputs.update(boundaries(position_ids, batch.get("sample_ends"), batch.get("cu_seq_lens")))
    if uses_packed_attention(model):  # what the rows are, so that the attention needs no mask (training/attention.py)
        if "cu_seq_lens" in batch:
            inputs[ROWS_KEY] = RowSegments(batch["cu_seq_lens"])
        elif position_ids is None and "attention_mask" not in batch:
            inputs[ROWS_KEY] = RowSegments.whole_rows()
    return inputs
