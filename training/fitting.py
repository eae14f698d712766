"""The memory plan a run trains with on the card it found (training/memory_plan.py): counted on the model as built,
with LoRA attached, against the memory the device has; the recipe's own settings on a CPU
(docs/training.md, "training/fitting.py")."""

from dataclasses import dataclass

import torch

from training import distributed, families, memory_plan
from training.recipe import RecipeError, RunRecipe


@dataclass(frozen=True)
class Choice:
    checkpointing: bool
    optimizer: str
    plan: memory_plan.Plan | None  # None: not chosen from the memory (a CPU, several GPUs, or nothing fits)
    words: str  # the trainer's log line and the run's event


def micro_step_tokens(recipe: RunRecipe) -> int:
    """Tokens a rank's micro-step holds at most: a DPO row is a pair."""
    pairs = any(phase.kind == "dpo" for phase in recipe.phases)
    return recipe.batch_size * recipe.seq_len * (2 if pairs else 1)


def usable_memory_gib(device, gpus: int = 1) -> float:
    """What this process's allocator may hold on the GPU: its reserve now and what the card has free, less what the
    run's kernels take outside the allocator (memory_plan.OUTSIDE_ALLOCATOR_GIB); on several GPUs what the card's
    model leaves usable, the same on every rank so that all choose the same plan."""
    if gpus > 1:
        return memory_plan.usable_gib(torch.cuda.get_device_properties(device).total_memory / memory_plan.GIB)
    free, _ = torch.cuda.mem_get_info(device)
    held = (free + torch.cuda.memory_reserved(device)) / memory_plan.GIB
    return max(0.0, held - memory_plan.OUTSIDE_ALLOCATOR_GIB)


def cap_allocator(device, usable_gib: float) -> float:
    """Hold PyTorch's caching allocator to `usable_gib` on `device`, so that what CUDA allocates beside it (Triton's
    kernels, their spills' local memory) finds the room the plan left. Returns the fraction of the card set (1.0: no
    cap)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1.0
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory / memory_plan.GIB
    fraction = min(1.0, max(usable_gib, 0.0) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def counted_run(recipe: RunRecipe, model, gpus: int) -> memory_plan.Run:
    """The run as the plan counts it: the model's own parameters, trainable (LoRA) and frozen (the base)."""
    return counted_run_of(model, micro_step_tokens(recipe), gpus)


def counted_run_of(model, tokens: int, gpus: int) -> memory_plan.Run:
    """`counted_run` for a micro-step of `tokens` (the benchmark's)."""
    lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    shape = memory_plan.shape_from_config(config, families.family_of(config).linear_attention)
    return memory_plan.Run(shape, tokens=tokens, gpus=gpus, lora_params=lora, weights_bytes=weights)


def choose(recipe: RunRecipe, model, device, gpus: int = 1, budget_gib: float | None = None,
           under_gib: float | None = None) -> Choice:
    """How this run trains: with `memory_plan: auto` on a GPU the plan `memory_plan.choose` takes in `budget_gib`
    (default: what the card has for this process), never less frugal than the recipe; otherwise the recipe's own
    settings. `under_gib` (a retry after running out of memory): the fastest plan that needs less than it."""
    device = torch.device(device)
    asked = (recipe.gradient_checkpointing, recipe.optimizer)
    if device.type != "cuda":
        if recipe.optimizer in memory_plan.OFFLOADED:
            raise RecipeError(f"optimizer {recipe.optimizer} keeps the optimizer's state on the host instead of the "
                              "GPU, and this run has no GPU: use adamw or adamw_8bit")
        return Choice(*asked, None, f"memory plan: no GPU, the recipe's own ({memory_plan.plan_name(*asked)})")
    run = counted_run(recipe, model, gpus)
    usable = budget_gib if budget_gib is not None else usable_memory_gib(device, gpus)
    keep = under_gib is None  # a retry's figure is already under a plan that left the headroom
    if under_gib is not None:
        usable = min(usable, under_gib)
    if recipe.memory_plan == "recipe":
        own = memory_plan.estimate(run, *asked, usable)
        return Choice(*asked, own, f"memory plan (the recipe's): {describe(own)}")
    host = host_memory_gib()
    plan = memory_plan.take(run, usable, recipe.optimizer, recipe.gradient_checkpointing, host_gib=host, keep=keep)
    unbounded = memory_plan.choose(run, usable, recipe.optimizer, recipe.gradient_checkpointing, keep=keep)
    short = "" if unbounded is None or host is None or unbounded.host_gib <= host else \
        f" (not {unbounded.name}: it pins {unbounded.host_gib:.1f} GiB on the host, which has {host:.1f} free)"
    if not plan.fits:  # the most frugal, said so; the run may still go out of memory
        return Choice(plan.checkpointing, plan.optimizer, plan,
                      f"memory plan: no plan fits {usable:.1f} GiB{short}; trying the most frugal: {describe(plan)}")
    tight = "" if plan.roomy else f" (no plan leaves the {plan.kept_gib:.1f} GiB of headroom kept; this one the most)"
    return Choice(plan.checkpointing, plan.optimizer, plan, f"memory plan (auto): {describe(plan)}{tight}{short}")


def host_memory_gib() -> float | None:
    """What the host's memory has available now (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / memory_plan.GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def checkpoint_layers(base, choice: "Choice") -> int:
    """Gradient checkpointing on `base` as the choice has it: every decoder layer, or the plan's first few (the rest
    keep their activations); returns how many layers recompute."""
    if not choice.checkpointing:
        return 0
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = distributed.decoder_layers(base)
    count = len(layers) if choice.plan is None else min(choice.plan.checkpointed, len(layers))
    for layer in layers[count:]:
        layer.gradient_checkpointing = False  # transformers' GradientCheckpointingLayer reads it at each call
    return count


def cast_factors(model, optimizer: str) -> None:
    """The LoRA factors (and so their gradients) in bf16 where the optimizer keeps them so (memory_plan.BF16_FACTORS);
    before anything holds them: the optimizer, a captured graph, a loaded checkpoint."""
    if optimizer not in memory_plan.BF16_FACTORS:
        return
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)


def describe(plan: memory_plan.Plan) -> str:
    """One line: the plan and where its memory goes."""
    host = f", {plan.host_gib:.1f} GiB on the host" if plan.host_gib else ""
    return (f"{plan.name}: weights {plan.weights_gib:.1f} + LoRA factors and gradients {plan.lora_gib:.1f} + optimizer "
            f"state {plan.optimizer_gib:.1f} + activations {plan.activations_gib:.1f} + head {plan.head_gib:.1f} + "
            f"slack {plan.slack_gib:.1f} = {plan.total_gib:.1f} of {plan.card_gib:.1f} GiB, headroom "
            f"{plan.headroom_gib:.1f} GiB{host}")
