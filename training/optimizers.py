"""The optimizer a phase steps with: AdamW with float32 moments, `AdamW8bit` (8-bit moments on our own kernel) or
AdamW on the host (`HostAdamW`, GPU only). Their state is saved as AdamW's own, float32 moments in plain tensors, which
any of them resumes from (docs/training.md, "training/optimizers.py")."""

import torch

from training.kernels import adamw8bit
from training.kernels._config import interpreting
from training.memory_plan import BF16_FACTORS, OPTIMIZERS
from training.recipe import RecipeError


class OptimizerError(RecipeError):
    """The optimizer cannot run here (offloading on a CPU-only run, a parameter it cannot step)."""


class HostAdamW(torch.optim.Optimizer):
    """AdamW whose moments and float32 copy of the factors live in the host's pinned memory: at each step the clipped
    gradients go to the host, AdamW steps there, the factors come back (why not torchao's CPUOffloadOptimizer:
    docs/training.md, "training/optimizers.py")."""

    def __init__(self, params, lr, weight_decay=0.0):
        self.device_params = [p for p in params if p.requires_grad]
        pin = torch.cuda.is_available()
        self.host_params = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.device_params]
        for host, p in zip(self.host_params, self.device_params, strict=True):
            host.copy_(p.detach())
            host.grad = torch.zeros_like(host, pin_memory=pin)
        self.host = torch.optim.AdamW(self.host_params, lr=lr, weight_decay=weight_decay, fused=True)
        super().__init__(self.device_params, {"lr": lr, "weight_decay": weight_decay})
        self.param_groups = self.host.param_groups  # the schedule sets the host optimizer's rate
        self.state = self.host.state

    @torch.no_grad()
    def step(self, closure=None):
        took = [p.grad is not None for p in self.device_params]
        for host, p, has in zip(self.host_params, self.device_params, took, strict=True):
            if has:
                host.grad.copy_(p.grad, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        grads = [host.grad for host in self.host_params]
        for host, has in zip(self.host_params, took, strict=True):
            if not has:
                host.grad = None  # AdamW leaves a parameter without a gradient as it is
        self.host.step()
        for host, p, grad, has in zip(self.host_params, self.device_params, grads, took, strict=True):
            host.grad = grad
            if has:
                p.copy_(host, non_blocking=True)
        return None

    def zero_grad(self, set_to_none=True):
        for p in self.device_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self):
        return self.host.state_dict()

    def load_state_dict(self, state_dict):
        self.host.load_state_dict(state_dict)
        self.param_groups = self.host.param_groups
        self.state = self.host.state
        with torch.no_grad():
            for host, p in zip(self.host_params, self.device_params, strict=True):
                host.copy_(p.detach())  # the checkpoint's factors are the model's: the master copy follows them


class AdamW8bit(torch.optim.Optimizer):
    """AdamW with 8-bit moments whose step is one Triton kernel per parameter (training/kernels/adamw8bit.py): no
    torchao, no compilation, no Python work per element. Its state dict holds AdamW's float32 moments, as every
    checkpoint does; loading one encodes them again."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def _state(self, p):
        state = self.state[p]
        if "exp_avg_scale" not in state:
            blocks = adamw8bit.blocks(p.numel())
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros(p.numel(), dtype=torch.int8, device=p.device),
                         exp_avg_sq=torch.zeros(p.numel(), dtype=torch.uint8, device=p.device),
                         exp_avg_scale=torch.zeros(blocks, device=p.device),
                         exp_avg_sq_scale=torch.zeros(blocks, device=p.device))
        return state

    @torch.no_grad()
    def step(self, closure=None):
        # Each tensor's place among all the groups' seeds its rounding bits: no two tensors draw the same ones.
        for index, (group, p) in enumerate((g, p) for g in self.param_groups for p in g["params"]):
            if p.grad is None:
                continue
            if not p.is_contiguous():
                raise OptimizerError("adamw_8bit steps contiguous parameters only")
            state = self._state(p)
            state["step"] += 1
            beta1, beta2 = group["betas"]
            run = adamw8bit.step if p.is_cuda or interpreting() else adamw8bit.step_in_torch
            run(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["exp_avg_scale"], state["exp_avg_sq_scale"],
                lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                step_number=float(state["step"]), seed=int(state["step"]) * 1_000_003 + index)
        return None

    def state_dict(self):
        saved = super().state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        for index, entry in saved["state"].items():
            shape = params[index].shape
            saved["state"][index] = {
                "step": entry["step"],
                "exp_avg": adamw8bit.decode(entry["exp_avg"], entry["exp_avg_scale"], False).view(shape),
                "exp_avg_sq": adamw8bit.decode(entry["exp_avg_sq"], entry["exp_avg_sq_scale"], True).view(shape)}
        return saved

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for p, entry in self.state.items():
            if "exp_avg_scale" in entry or "exp_avg" not in entry:
                continue
            for key, second in (("exp_avg", False), ("exp_avg_sq", True)):
                entry[key], entry[f"{key}_scale"] = (t.to(p.device) for t in adamw8bit.encode(entry[key], second))
            entry["step"] = torch.as_tensor(entry["step"], dtype=torch.float32).cpu()


def build(name: str, params, *, lr: float, weight_decay: float, device) -> torch.optim.Optimizer:
    """The optimizer `name` (memory_plan.OPTIMIZERS) over `params` on `device`."""
    device = torch.device(device)
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=device.type == "cuda")
    if name == "adamw_8bit":
        return AdamW8bit(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw_8bit_bf16":
        _factors_as_planned(name, params)
        return AdamW8bit(params, lr=lr, weight_decay=weight_decay)  # a bf16 factor is rounded stochastically
    if name in ("adamw_offload", "adamw_offload_bf16"):
        if device.type != "cuda":
            raise OptimizerError(f"optimizer {name} moves the optimizer's state from the GPU to the host, and this run "
                                 "has no GPU: use adamw or adamw_8bit")
        _factors_as_planned(name, params)
        return HostAdamW(params, lr=lr, weight_decay=weight_decay)  # float32 on the host whatever the factors
    raise OptimizerError(f"optimizer: one of {', '.join(OPTIMIZERS)}, got {name!r}")


def _factors_as_planned(name, params):
    if name in BF16_FACTORS and any(p.dtype != torch.bfloat16 for p in params):
        raise OptimizerError(f"optimizer {name} steps bf16 factors: cast them first (training/fitting.cast_factors)")


def state_dict(optimizer) -> dict:
    """AdamW's own state dict with plain float32 moments, whichever optimizer this is (ours 8-bit decodes its codes):
    what a checkpoint holds (plain tensors, loaded with weights_only) and any of them resumes from."""
    return optimizer.state_dict()


def load_state_dict(optimizer, saved: dict) -> None:
    """`state_dict`'s form (AdamW's own, as every checkpoint holds it) into `optimizer`: its own settings kept where
    the checkpoint lacks one (another optimizer saved it), each moment put in the form this optimizer keeps it."""
    own = optimizer.state_dict()
    groups = [{**mine, **{key: value for key, value in theirs.items() if key in mine and key != "params"}}
              for mine, theirs in zip(own["param_groups"], saved["param_groups"], strict=True)]
    optimizer.load_state_dict({"state": saved["state"], "param_groups": groups})
