"""Autotune configs shared by the kernels, pruned to what a device's shared memory can launch; the CPU interpreter gets
one small config (docs/training.md, "training/kernels/_config.py")."""

import copy
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
        triton.Config(dict(zip(names, shape[: len(names)], strict=True)), num_warps=shape[-2], num_stages=shape[-1])
        for shape in shapes
    ]


# Shared memory one program may use, in bytes, by CUDA device index: what Triton checks a kernel against at launch
# (about 227 KB on Hopper and B200, about 99 KB on sm_120 workstation cards such as the RTX PRO 6000).
_shared_memory: dict[int, int] = {}


def shared_memory_limit(device):
    """Bytes of shared memory a program may use on this device, read once; None where there is no such limit (CPU)."""
    if device.type != "cuda":
        return None
    import torch
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _shared_memory:
        _shared_memory[index] = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    return _shared_memory[index]


def fitting(configs, shared_bytes, limit):
    """The configs whose shared memory (shared_bytes(config, stages), an estimate) fits `limit`: each as it is where
    it fits, else with the most pipeline stages that fit (the same tiles, fewer loads in flight), else left out."""
    kept, seen = [], set()
    for config in configs:
        stages = config.num_stages
        while stages > 1 and shared_bytes(config, stages) > limit:
            stages -= 1
        if shared_bytes(config, stages) > limit:
            continue
        if stages != config.num_stages:
            config = copy.copy(config)
            config.num_stages = stages
        key = (tuple(sorted(config.kwargs.items())), config.num_warps, config.num_stages)
        if key not in seen:
            seen.add(key)
            kept.append(config)
    return kept


def shared_memory_prune(shared_bytes, tensor_arg, then=None):
    """An autotuner's `early_config_prune` that keeps only configs that can launch on the argument's device:
    shared_bytes(config, stages, named_args, kwargs) estimates a config's shared memory; `then` prunes first."""

    def prune(configs, named_args, **kwargs):
        if then is not None:
            configs = then(configs, named_args, **kwargs)
        limit = shared_memory_limit(named_args[tensor_arg].device)
        if limit is None:
            return configs
        kept = fitting(configs, lambda config, stages: shared_bytes(config, stages, named_args, kwargs), limit)
        if not kept:
            raise ValueError(f"no config of this kernel fits the device's {limit} bytes of shared memory per program")
        return kept

    return prune
