"""Autotune configs shared by the kernels; the CPU interpreter gets one small config (it would time them all)."""

import os

import triton


def interpreting():
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def m_bucket(m):
    """Autotune once per power of two of a row count, not for every batch size."""
    return 1 << max(int(m) - 1, 0).bit_length()


def autotune_configs(shapes, names):
    """shapes: (block sizes..., num_warps, num_stages) tuples; names: the block-size names, in order."""
    if interpreting():
        return [triton.Config({name: 32 for name in names}, num_warps=4, num_stages=1)]
    return [
        triton.Config(dict(zip(names, shape[: len(names)])), num_warps=shape[-2], num_stages=shape[-1])
        for shape in shapes
    ]
