"""Expert parallelism: each rank holds a contiguous slice of every layer's routed experts, and the routed tokens travel
there and back in two all-to-alls (docs/training.md, "training/expert_parallel.py")."""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from training.lora import routed_experts_modules, routed_lora_wrappers
from training.moe_lora import EXPERT_SHARD_ATTRIBUTE


class _AllToAll(torch.autograd.Function):
    """Rows to the ranks of `group` (send_sizes[r] rows to rank r, recv_sizes[r] from it); backward the reverse."""

    @staticmethod
    def forward(ctx, rows, send_sizes, recv_sizes, group):
        ctx.sizes, ctx.group = (send_sizes, recv_sizes), group
        out = rows.new_empty((sum(recv_sizes), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), recv_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_sizes, recv_sizes = ctx.sizes
        back = grad.new_empty((sum(send_sizes), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), send_sizes, recv_sizes, group=ctx.group)
        return back, None, None, None


@dataclass
class ExpertShard:
    """Experts [start, start + num_local) of num_local * size, held by rank `rank` of `group`."""

    group: object
    rank: int
    size: int
    num_local: int

    @property
    def start(self):
        return self.rank * self.num_local

    def exchange(self, local_experts, hidden, top_k_index, top_k_weights):
        """The experts' output for this rank's tokens (T, H), every choice run where its expert is held.
        local_experts(rows, local index (R, 1), weights (R, 1)) runs this rank's experts on the rows it received."""
        num_tokens, top_k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        send_counts = torch.bincount(flat, minlength=self.num_local * self.size).view(self.size, self.num_local)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_sizes, recv_sizes = torch.stack([send_counts.sum(1), recv_counts.sum(1)]).tolist()
        received = _AllToAll.apply(hidden[order // top_k], send_sizes, recv_sizes, self.group)
        if received.shape[0]:
            local_index = torch.arange(self.num_local, device=flat.device).repeat(self.size)
            local_index = local_index.repeat_interleave(recv_counts.reshape(-1)).unsqueeze(-1)
            ones = torch.ones(local_index.shape, dtype=top_k_weights.dtype, device=flat.device)
            results = local_experts(received, local_index, ones)
        else:  # nothing for this rank's experts: the empty rows stay in the graph, so the reverse exchange runs
            results = received
        returned = _AllToAll.apply(results, recv_sizes, send_sizes, self.group)
        pairs = returned[torch.argsort(order)].view(num_tokens, top_k, -1)
        weighted = pairs.to(torch.promote_types(pairs.dtype, top_k_weights.dtype)) * top_k_weights.unsqueeze(-1)
        return weighted.sum(dim=1).to(hidden.dtype)


@dataclass
class ExpertSlices:
    """This rank's shard of the experts, and the parameters `split_module` made slices of."""

    shard: ExpertShard
    base: list = field(default_factory=list)  # frozen expert weights (E_local, ...)
    lora_a: list = field(default_factory=list)  # (r * E_local, in), rows grouped by expert
    lora_b: list = field(default_factory=list)  # (out, r * E_local), columns rank-major, expert-minor

    @property
    def parameters(self):
        return [*self.base, *self.lora_a, *self.lora_b]

    def local_ids(self):
        return {id(p) for p in self.parameters}


def plan_slices(model, group, rank, size):
    """The slices this rank will hold (none taken yet; `split_module` takes them, a part of the model at a time, in
    place, and routes the experts' forward through the exchange). LoRA must be attached first: its factors are
    sliced with the experts they belong to."""
    experts_modules = routed_experts_modules(model)
    num_experts = {module.gate_up_proj.shape[0] for _, module in experts_modules}
    if len(num_experts) != 1 or next(iter(num_experts)) % size:
        raise ValueError(f"expert parallelism over {size} ranks needs every layer's expert count {sorted(num_experts)}"
                         f" divisible by {size}")
    return ExpertSlices(ExpertShard(group, rank, size, next(iter(num_experts)) // size))


def split_module(module, slices):
    """Take this rank's slice of the routed experts and their LoRA factors under `module` (the whole model or one
    decoder layer), into `slices`."""
    rank, size, num_local = slices.shard.rank, slices.shard.size, slices.shard.num_local
    keep = slice(rank * num_local, (rank + 1) * num_local)
    for _, experts in routed_experts_modules(module):
        for name in ("gate_up_proj", "down_proj"):
            old = experts._parameters[name]
            new = torch.nn.Parameter(old.data[keep].clone(), requires_grad=old.requires_grad)
            experts._parameters[name] = new
            slices.base.append(new)
        experts.num_experts = num_local
        experts.__dict__[EXPERT_SHARD_ATTRIBUTE] = slices.shard
    for _, _, wrapper in routed_lora_wrappers(module):
        wrapper.num_experts = num_local
        for layer in wrapper.lora_A.values():
            r = layer.weight.shape[0] // (num_local * size)
            layer.weight = torch.nn.Parameter(layer.weight.data[rank * num_local * r:(rank + 1) * num_local * r]
                                              .clone(), requires_grad=layer.weight.requires_grad)
            layer.out_features = layer.weight.shape[0]
            slices.lora_a.append(layer.weight)
        for layer in wrapper.lora_B.values():
            out, columns = layer.weight.shape
            local = layer.weight.data.view(out, columns // (num_local * size), num_local * size)[:, :, keep]
            layer.weight = torch.nn.Parameter(local.reshape(out, -1).clone(), requires_grad=layer.weight.requires_grad)
            layer.in_features = layer.weight.shape[1]
            slices.lora_b.append(layer.weight)


def gather_full(slices, param, tensor=None):
    """The whole-model value of an expert-sliced LoRA factor (or of `tensor`, its gradient or optimizer state, in
    the same layout), assembled from every rank's slice in peft's layout; every rank of the group calls it."""
    tensor = param.detach() if tensor is None else tensor
    shard = slices.shard
    parts = [torch.empty_like(tensor) for _ in range(shard.size)]
    dist.all_gather(parts, tensor.contiguous(), group=shard.group)
    ids = {id(p) for p in slices.lora_b}
    if id(param) not in ids:
        return torch.cat(parts, dim=0)
    out = tensor.shape[0]
    return torch.cat([p.view(out, -1, shard.num_local) for p in parts], dim=2).reshape(out, -1)


@torch.no_grad()
def average_expert_grads(slices):
    """Expert LoRA gradients are sums over every rank's tokens; divide by the group size (see the module's doc)."""
    grads = [p.grad for p in slices.lora_a + slices.lora_b if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, 1.0 / slices.shard.size)
