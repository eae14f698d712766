"""The trainer on the GPUs of one box: FSDP2 for the dense parts, expert parallel for the routed experts; `command`
builds the torchrun line (docs/training.md, "training/distributed.py")."""

import functools
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from training import checkpoint, expert_parallel, families, guards, sharded_checkpoint
from training.lora import routed_experts_modules


def command(recipe_path, gpus, python=None):
    """The command line that starts a recipe's trainer on `gpus` ranks of this box, as a list of arguments."""
    return [*launcher(gpus, python), "-m", "training.train", "--recipe", str(recipe_path)]


def launcher(gpus, python=None):
    """The start of a command line that runs a module or script on `gpus` ranks of this box (torchrun)."""
    python = python or sys.executable
    if gpus == 1:
        return [python]
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]


def command_line(recipe_path, gpus):
    return shlex.join(command(recipe_path, gpus))


def launched_ranks():
    """How many ranks the launcher started (torchrun's WORLD_SIZE; 1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class OneRank:
    """A one-process run, with the methods of `Ranks`: each one what that method comes to on a single rank."""

    device: torch.device
    rank = 0
    size = 1
    main = True
    can_capture = True  # its micro-steps read nothing on the host: CUDA graphs may replay them

    def sum(self, tensor):
        return tensor

    def any(self, flag):
        return bool(flag)

    def gather(self, value):
        return [value]

    def barrier(self):
        pass

    def everywhere(self, check):
        return check()

    def rank_slice(self, indices):
        return indices

    def build_device(self):
        return self.device

    def shard(self, model):
        """Nothing to split; the start-up guard `Ranks.shard` runs layer by layer runs on the whole model."""
        guards.check_experts_forward_is_ours(model)
        return model

    def average_expert_grads(self):
        pass

    def grad_norm(self, params):
        return grad_squares(params).sqrt()

    def local_figures(self, groups):
        return {}

    def totals(self, record):
        return record

    def uploader(self, model, store, staging, keep, protected=frozenset()):
        return checkpoint.Uploader(store, staging, keep, protected=protected)

    def resume(self, model, store, staging, check):
        """(name, trainer state) of the newest complete checkpoint, its adapter loaded into `model` once `check(name,
        state)` has passed; or (None, None)."""
        from peft import set_peft_model_state_dict

        name = checkpoint.latest_complete(store)
        if name is None:
            return None, None
        adapter, state = checkpoint.load(store, name, Path(staging) / "resume")
        check(name, state)
        set_peft_model_state_dict(model, {k: v.to(self.device) for k, v in adapter.items()})
        return name, state

    def leave(self):
        pass


@dataclass
class Ranks:
    """This process's place among the ranks, and what the trainer needs of them."""

    rank: int
    size: int
    device: torch.device
    mesh: object
    slices: expert_parallel.ExpertSlices | None = None
    can_capture = False  # the experts' exchange reads its split sizes on the host: no CUDA graphs

    @property
    def main(self):
        return self.rank == 0

    def sum(self, tensor):
        """The sum over every rank of a tensor (a new tensor; every rank calls it)."""
        tensor = tensor.detach().clone()
        dist.all_reduce(tensor)
        return tensor

    def any(self, flag):
        return bool(self.sum(torch.tensor(int(bool(flag)), device=self.device)))

    def gather(self, value):
        """Every rank's `value` (any picklable thing), in rank order."""
        values = [None] * self.size
        dist.all_gather_object(values, value)
        return values

    def barrier(self):
        dist.barrier()

    def everywhere(self, check):
        """Run a guard on every rank; if it fails on any, raise on every rank with each failing rank's reason."""
        try:
            result, failure = check(), None
        except guards.GuardError as exc:
            result, failure = None, (type(exc), str(exc))
        failures = [(rank, f) for rank, f in enumerate(self.gather(failure)) if f is not None]
        if failures:
            kind = failures[0][1][0]
            raise kind("\n".join(f"rank {rank} of {self.size}: {message}" for rank, (_, message) in failures))
        return result

    def rank_slice(self, indices):
        """This rank's part of a global batch of `batch_size * size` indices."""
        per_rank = len(indices) // self.size
        return indices[self.rank * per_rank:(self.rank + 1) * per_rank]

    def build_device(self):
        """Where this rank builds the model before `shard`: the first rank loads it into host memory, the others
        build it on the meta device (no memory, nothing read) and receive each part from the first as it is
        sharded."""
        return torch.device("cpu") if self.main else torch.device("meta")

    def shard(self, model):
        """Split the routed experts over the ranks, then shard the rest with FSDP2 one decoder layer at a time, so no
        rank's device holds more than one whole layer (docs/training.md, "training/distributed.py")."""
        from torch.distributed.fsdp import fully_shard

        self.slices = expert_parallel.plan_slices(model, dist.group.WORLD, self.rank, self.size)
        layers = decoder_layers(model)
        for layer in layers:
            self._receive(layer, [])
            expert_parallel.split_module(layer, self.slices)
            if routed_experts_modules(layer):
                self.everywhere(functools.partial(guards.check_experts_forward_is_ours, layer))
            kept = self.slices.local_ids()
            fully_shard(layer, mesh=self.mesh, ignored_params={p for p in layer.parameters() if id(p) in kept})
        self._receive(model, layers)  # embeddings, final norm, head, rotary buffers
        fully_shard(model, mesh=self.mesh, ignored_params=set(self.slices.parameters))
        return model

    @torch.no_grad()
    def _receive(self, module, skip):
        """The parameters and buffers of `module` outside the modules in `skip`, on this rank's device with the
        first rank's values (sent by it, in the same order on every rank: the modules are built alike)."""
        skipped = {id(m) for part in skip for m in part.modules()}
        placed = {}  # id of a tensor already sent -> what now stands for it (tied weights stay tied)
        for owner in module.modules():
            if id(owner) in skipped:
                continue
            for table in (owner._parameters, owner._buffers):
                for key, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    if id(tensor) in placed:
                        table[key] = placed[id(tensor)]
                        continue
                    on_device = (tensor.to(self.device) if self.main
                                 else torch.empty_like(tensor, device=self.device))
                    payload = on_device if on_device.is_contiguous() else on_device.contiguous()
                    dist.broadcast(payload, src=0)  # the collectives take contiguous tensors only
                    if payload is not on_device:
                        on_device.copy_(payload)
                    if on_device is not tensor and table is owner._parameters:
                        on_device = torch.nn.Parameter(on_device, requires_grad=tensor.requires_grad)
                    placed[id(tensor)] = table[key] = on_device

    def average_expert_grads(self):
        expert_parallel.average_expert_grads(self.slices)

    def grad_norm(self, params):
        """The gradient norm of `params` over every rank's part of them (FSDP shards, expert slices)."""
        return self.sum(grad_squares(params).to(self.device)).sqrt()

    def local_figures(self, groups):
        """This rank's own figures for `totals` to keep, read before the gradients are zeroed: the norm of its
        slice of the routed LoRA's gradients."""
        return {"grad_norm_routed_local": float(grad_squares(groups.get(families.ROUTED, ())).sqrt())}

    def full_value(self, name, param, tensor=None):
        """A parameter's (or its gradient's, or optimizer state's) whole-model value; every rank calls it."""
        tensor = param.detach() if tensor is None else tensor
        if id(param) in self.slices.local_ids():
            return expert_parallel.gather_full(self.slices, param, tensor)
        if hasattr(tensor, "full_tensor"):
            return tensor.full_tensor()
        return tensor

    def totals(self, record):
        """A step's record over every rank: the loss averaged, tokens and still-zero B slices summed, norms of the
        whole model, memory per GPU at its highest; each rank's own figures under "ranks"."""
        mine = {key: record[key] for key in PER_RANK}
        everyone = self.gather({"rank": self.rank, **mine})
        total = dict(record)
        total["loss"] = sum(r["loss"] for r in everyone) / self.size
        total["tokens"] = sum(r["tokens"] for r in everyone)
        total["step_s"] = max(r["step_s"] for r in everyone)
        total["tokens_per_s"] = total["tokens"] / total["step_s"]
        total["routed_b_zero"] = sum(r["routed_b_zero"] for r in everyone)
        total["routed_b_count"] = sum(r["routed_b_count"] for r in everyone)
        total["routed_b_norm"] = sum(r["routed_b_norm"] ** 2 for r in everyone) ** 0.5
        for key in ("gpu_mem_gib", "gpu_peak_gib", "gpu_allocated_gib"):
            held = [r[key] for r in everyone if r[key] is not None]
            total[key] = max(held) if held else None
        total["ranks"] = everyone
        return total

    def uploader(self, model, store, staging, keep, protected=frozenset()):
        return sharded_checkpoint.ShardedUploader(self, model, store, staging, keep, protected=protected)

    def resume(self, model, store, staging, check):
        """(name, trainer state) of the newest complete checkpoint, loaded into `model` on every rank (DCP loads in
        place, before `check(name, state)` can run); or (None, None)."""
        name, state = sharded_checkpoint.resume(self, model, store, staging)
        if name is not None:
            check(name, state)
        return name, state

    def leave(self):
        if dist.is_initialized():
            dist.destroy_process_group()


# A rank's own figures, kept in the record under "ranks" (the gradient norms are of its local slice of the routed
# experts, so a rank whose experts got nothing shows there).
PER_RANK = ("loss", "tokens", "step_s", "routed_b_zero", "routed_b_count", "routed_b_norm", "grad_norm_routed_local",
            "gpu_mem_gib", "gpu_peak_gib", "gpu_allocated_gib")


def decoder_layers(model):
    """The decoder layers: the first ModuleList whose items hold routed experts."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and any(routed_experts_modules(m) for m in module):
            return list(module)
    raise ValueError("no list of decoder layers with routed experts found in the model")


def join(gpus, device=None):
    """Join the ranks torchrun started for a recipe of `gpus` GPUs; a OneRank for a one-process run."""
    launched = launched_ranks()
    if gpus == 1 and launched == 1:
        return OneRank(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    if launched != gpus:
        raise RuntimeError(f"the recipe asks for {gpus} GPU(s) but {launched} rank(s) were started; start it with "
                           f"{command_line('RECIPE', gpus)}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.device_count() < gpus:
            raise RuntimeError(f"the recipe asks for {gpus} GPUs; this box has {torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if
                                device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return Ranks(rank=dist.get_rank(), size=dist.get_world_size(), device=device, mesh=mesh)


def local(tensor):
    """The part of a tensor this rank holds (an FSDP-sharded DTensor's shard; a plain tensor itself)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def grad_squares(params):
    """The sum of squares of this rank's part of the gradients of `params` (a 0-d tensor)."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    return torch.stack([g.float().norm() ** 2 for g in grads]).sum() if grads else torch.zeros(())
