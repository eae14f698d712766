"""Checks that abort a run before it wastes hours training routed-expert LoRA that never learns (docs/training.md,
"training/guards.py")."""

import torch

from training import moe_lora
from training.lora import (module_lora_parameters, routed_experts_modules, routed_lora_parameters,
                           routed_lora_wrappers)


class GuardError(RuntimeError):
    """A start-up or step-1 guard failed; the run must not go on."""


class ExpertsForwardReplaced(GuardError):
    pass


class LoraDeltaMissing(GuardError):
    pass


class LoraNoGradient(GuardError):
    """A targeted LoRA module got no gradient at step 1."""


class RoutedLoraNoGradient(LoraNoGradient):
    pass


def _moe_blocks(model):
    """(name, block, experts) for each MoE block: a module with an `experts` child whose base is a routed experts."""
    experts_by_id = {id(module): module for _, module in routed_experts_modules(model)}
    blocks = []
    for name, module in model.named_modules():
        child = getattr(module, "experts", None)
        if isinstance(child, torch.nn.Module):
            base = child.get_base_layer() if hasattr(child, "get_base_layer") else child
            if id(base) in experts_by_id:
                blocks.append((name, module, base))
    return blocks


@torch.no_grad()
def check_experts_forward_is_ours(model, num_tokens=4):
    """Run every MoE block on a few random tokens and require that our experts forward ran for it."""
    blocks = _moe_blocks(model)
    if not blocks:
        raise ExpertsForwardReplaced("no MoE block with routed experts found in the model")
    problems = []
    for name, block, experts in blocks:
        implementation = getattr(experts.config, "_experts_implementation", None)
        if implementation != moe_lora.IMPLEMENTATION_NAME:
            problems.append(f"{name}: experts_implementation is {implementation!r}, "
                            f"not {moe_lora.IMPLEMENTATION_NAME!r}")
            continue
        param = experts.gate_up_proj
        probe = torch.randn(1, num_tokens, param.shape[-1], device=param.device, dtype=param.dtype)
        before = moe_lora.forward_calls[id(experts)]
        block(probe)
        if moe_lora.forward_calls[id(experts)] == before:
            forward = getattr(type(experts).forward, "__qualname__", repr(type(experts).forward))
            problems.append(
                f"{name}: the moe_lora experts forward did not run (block forward "
                f"{type(block).forward.__module__}.{type(block).forward.__qualname__}, experts forward {forward}); "
                "an import replaced it"
            )
    if problems:
        raise ExpertsForwardReplaced("refusing to start, the routed experts would not run our forward:\n"
                                     + "\n".join(problems))


@torch.no_grad()
def check_lora_delta_in_forward(model, forward, std=0.02, seed=0):
    """Set every routed-expert lora_B to random values: what `forward()` returns (a probe's logits) must move by more
    than running it twice moves it. Restores B afterwards. Returns (how far it moved, how far a second run moved)."""
    wrappers = routed_lora_wrappers(model)
    if not wrappers:
        raise LoraDeltaMissing("the model has no routed-expert LoRA")
    saved = [(layer.weight, layer.weight.detach().clone()) for _, _, w in wrappers for layer in w.lora_B.values()]
    try:
        base = forward().detach().float()
        noise = float((forward().detach().float() - base).abs().max())
        generator = torch.Generator().manual_seed(seed)
        for weight, _ in saved:
            weight.copy_((torch.randn(weight.shape, generator=generator) * std).to(weight.device, weight.dtype))
        moved = float((forward().detach().float() - base).abs().max())
    finally:
        for weight, value in saved:
            weight.copy_(value)
    if not moved > 10 * noise:
        raise LoraDeltaMissing(
            f"setting routed-expert LoRA B to nonzero values moved the probe's output by {moved:.3g} at most (a "
            f"second run as it was: {noise:.3g}): the routed LoRA delta is not in the forward"
        )
    return moved, noise


def routed_lora_grad_norms(model):
    """name -> gradient norm (None if no gradient) of each routed-expert LoRA factor: the per-phase metric."""
    return {name: _grad_norm(param) for name, param in routed_lora_parameters(model).items()}


def _grad_norm(param):
    return None if param.grad is None else float(param.grad.detach().float().norm())


def _missing_grads(params, norms):
    """Each B needs a nonzero gradient, each A too where its B is nonzero (B == 0: A's is zero by construction)."""
    missing = []
    for name, param in params.items():
        if not param.requires_grad:
            missing.append(f"{name}: requires_grad is False")
            continue
        if ".lora_A." in name:
            partner = params[name.replace(".lora_A.", ".lora_B.")]
            if not bool(partner.detach().ne(0).any()):
                continue
        if not norms[name]:
            missing.append(f"{name}: gradient {'missing' if norms[name] is None else 'zero'}")
    return missing


def check_lora_grads(model):
    """After the first backward: the routed experts (`check_routed_lora_grads`), then every other targeted group on
    its own: each of its LoRA modules got a gradient. Returns name -> gradient norm of every factor checked."""
    norms = check_routed_lora_grads(model)
    problems = []
    for group, params in module_lora_parameters(model).items():
        group_norms = {name: _grad_norm(param) for name, param in params.items()}
        missing = _missing_grads(params, group_norms)
        if missing:
            problems.append(f"{group}: {len(missing)} of {len(params)} LoRA parameters got no gradient:\n"
                            + "\n".join(missing))
        norms.update(group_norms)
    if problems:
        raise LoraNoGradient("targeted LoRA modules got no gradient at step 1 (each group checked on its own); "
                             "aborting:\n" + "\n".join(problems))
    return norms


def check_routed_lora_grads(model):
    """After the first backward: each routed LoRA B has a nonzero gradient, and each A too where its B is nonzero."""
    params = routed_lora_parameters(model)
    if not params:
        raise RoutedLoraNoGradient("the model has no routed-expert LoRA parameters")
    norms = routed_lora_grad_norms(model)
    missing = _missing_grads(params, norms)
    if missing:
        raise RoutedLoraNoGradient(
            f"{len(missing)} of {len(params)} routed-expert LoRA parameters got no gradient at step 1 "
            "(attention LoRA not counted); aborting:\n" + "\n".join(missing)
        )
    return norms
