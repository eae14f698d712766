"""The router's load: how many (token, choice) pairs each routed expert received per layer, counted on the device in
the training forwards and read on the host once per logging interval (docs/training.md, "training/router_load.py")."""

import torch

from training.lora import routed_experts_modules
from training.moe_lora import EXPERT_SHARD_ATTRIBUTE, ROUTER_COUNTER_ATTRIBUTE


class RouterCounter:
    """A persistent (MoE layers, experts) int64 tensor on the device, added into in place by every training forward
    (graph-safe: a CUDA graph replay adds into the same tensor); `take` reads and clears it."""

    def __init__(self, layers: int, experts: int, device):
        self.counts = torch.zeros((layers, experts), dtype=torch.int64, device=device)

    def add(self, row: int, top_k_index: torch.Tensor) -> None:
        """Count one layer's routing choices (T, K) of global expert ids. A forward without gradient (a reference's
        or a rollout's) is not training, and one run inside a backward is gradient checkpointing's recompute of a
        forward already counted: neither counts."""
        if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
            return
        flat = top_k_index.reshape(-1)
        self.counts[row].scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int64))

    def take(self, ranks) -> list[list[int]]:
        """The counts since the last take, summed over every rank (each counted its own tokens), as lists; cleared.
        Every rank calls it at the same step."""
        total = ranks.sum(self.counts).tolist()
        self.counts.zero_()
        return total

    def reset(self) -> None:
        self.counts.zero_()


def attach_counter(model, device) -> RouterCounter | None:
    """A counter on every routed-experts module of `model`, one row per MoE layer in model order (None: no routed
    experts). Under expert parallelism a module holds a slice; the router ids and the columns stay global."""
    modules = [module for _, module in routed_experts_modules(model)]
    if not modules:
        return None
    sizes = {_global_experts(module) for module in modules}
    if len(sizes) != 1:
        raise ValueError(f"router load: every MoE layer needs the same expert count, got {sorted(sizes)}")
    counter = RouterCounter(len(modules), sizes.pop(), device)
    for row, module in enumerate(modules):
        module.__dict__[ROUTER_COUNTER_ATTRIBUTE] = (counter, row)  # not a submodule, not in the state dict
    return counter


def detach_counter(model) -> None:
    for _, module in routed_experts_modules(model):
        module.__dict__.pop(ROUTER_COUNTER_ATTRIBUTE, None)


def _global_experts(module) -> int:
    shard = module.__dict__.get(EXPERT_SHARD_ATTRIBUTE)
    local = module.gate_up_proj.shape[0]
    return shard.num_local * shard.size if shard is not None else local


NOT_READ = {"router_max_mean": None, "router_idle_experts": None}  # a step between two reads


def summary(counts: list[list[int]]) -> dict:
    """The record's router fields from one interval's counts: the worst layer's max/mean load ratio (1.0 is an even
    load; the expert count is its highest), the (layer, expert) pairs that got no token, and the counts themselves."""
    ratios = [max(row) * len(row) / sum(row) for row in counts if sum(row)]
    return {"router_max_mean": max(ratios) if ratios else None,
            "router_idle_experts": sum(1 for row in counts for c in row if c == 0),
            "router_load": counts}
