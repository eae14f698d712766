"""The workload: the ranking's view of a fine-tune (a run's recipe, `training.recipe.RunRecipe`, or a profile's),
carrying everything that turns a step time into a whole run's money."""

import math
from dataclasses import asdict, dataclass, fields, replace

from training.memory_plan import MEMORY_PLANS, OPTIMIZERS

from . import memory
from .values import number, whole

KERNEL_PATHS = ("auto", "grouped_mm", "triton")
MAX_GPUS = 16  # the GPUs of one box, as the trainer's recipe allows (training/recipe.py)
# What each rank holds beside its share of the BF16 weights: its activations at the recipe's own micro-step (2 x 2048
# tokens by default), the adapters with their optimizer state, and the allocator's headroom. One GPU with 35B gives
# 85 GB, what docs/field-notes.md gives for a 30B vanilla-peft run that OOMed on an 80 GB card. A run whose micro-step
# or LoRA rank differs from its profile's needs more: micro_step_vram_gb.
RANK_OVERHEAD_GB = 15.0

# Compute capabilities where torch._grouped_mm takes its CUTLASS path (sm_90 Hopper, sm_100 B200). Elsewhere it falls
# back to a host sync and one matmul per group, so "auto" picks the project's Triton grouped GEMM there.
GROUPED_MM_FAST_CAPABILITIES = frozenset({90, 100})


@dataclass(frozen=True, slots=True)
class Phase:
    name: str  # "cpt", "sft", "dpo", "kto", "grpo"
    steps: int


@dataclass(frozen=True, slots=True)
class Workload:
    model: str = "Qwen3.6-35B-A3B"
    total_params_b: float = 35.0
    active_params_b: float = 3.0
    lora_rank: int = 32
    batch_size: int = 2
    grad_accum: int = 8
    seq_len: int = 2048
    phases: tuple[Phase, ...] = (
        Phase("cpt", 1500),
        Phase("sft", 1500),
        Phase("dpo", 800),
        Phase("kto", 800),
        Phase("grpo", 400),
    )  # about 20 h on an H200 (docs/field-notes.md)
    kernel_path: str = "auto"  # "auto" resolves per GPU architecture, see resolve_kernel_path
    checkpoint_interval_s: float = 1800.0
    checkpoint_gb: float = 7.4  # routed-expert adapter at rank 32 (docs/field-notes.md); attention adapter is small
    model_download_gb: float = 67.0  # BF16 base
    image_gb: float = 12.0  # worker image pulled at the host's downlink
    boot_s: float = 120.0  # rent -> container running, before the image pull and model download
    rent_disk_gb: float = 250.0  # disk rented with the box: base + merged BF16 copy + FP8 copy
    vram_needed_gb: float | None = None  # per GPU; None: BF16 weights plus headroom, see vram_gb
    gpus: int = 1  # the GPUs of one box the trainer runs on (torchrun, one rank each)
    # The recipe's own memory settings (training/recipe.py): the plan the trainer takes on each card follows them.
    optimizer: str = "adamw"
    gradient_checkpointing: bool = False
    memory_plan: str = "auto"

    def __post_init__(self):
        problems = []
        for name in ("total_params_b", "active_params_b", "checkpoint_interval_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        for name in ("lora_rank", "batch_size", "grad_accum", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a whole number >= 1")
        for name in ("checkpoint_gb", "model_download_gb", "image_gb", "boot_s", "rent_disk_gb"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0")
        if self.kernel_path not in KERNEL_PATHS:
            problems.append(f"kernel_path must be one of {', '.join(KERNEL_PATHS)}")
        if not self.phases:
            problems.append("a recipe needs at least one phase")
        if any(p.steps < 1 for p in self.phases):
            problems.append("every phase needs at least one step")
        if self.vram_needed_gb is not None and not self.vram_needed_gb > 0:
            problems.append("vram_needed_gb must be > 0")
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or not 1 <= self.gpus <= MAX_GPUS:
            problems.append(f"gpus must be a whole number from 1 to {MAX_GPUS} (the GPUs of one box)")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        if self.memory_plan not in MEMORY_PLANS:
            problems.append(f"memory_plan must be one of {', '.join(MEMORY_PLANS)}")
        if not isinstance(self.gradient_checkpointing, bool):
            problems.append("gradient_checkpointing must be true or false")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    @property
    def vram_gb(self) -> float:
        """The least memory each GPU must list: the recipe's own figure where it states one; for a model the memory
        plan knows, the smallest card some plan fits on (fleet/ranking/memory.py); else its share of the BF16 base
        (2 bytes a parameter, sharded over the recipe's GPUs) and what one rank needs beside it (RANK_OVERHEAD_GB)."""
        if self.vram_needed_gb is not None:
            return self.vram_needed_gb
        least = memory.least_card_gb(self)
        if least is not None:
            return least
        return 2.0 * self.total_params_b / self.gpus + RANK_OVERHEAD_GB

    @property
    def vram_total_gb(self) -> float:
        """What the recipe's GPUs must hold together: the weights once, and every rank's own share."""
        return self.vram_gb * self.gpus

    def to_dict(self) -> dict:
        data = asdict(self)
        data["phases"] = [[p.name, p.steps] for p in self.phases]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Workload":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown recipe field(s): {', '.join(unknown)}")
        values = dict(data)
        if "phases" in values:
            phases = []
            for item in values["phases"]:
                if isinstance(item, dict):
                    item = (item.get("name"), item.get("steps"))
                try:
                    name, steps = item
                    phases.append(Phase(str(name), int(steps)))
                except (TypeError, ValueError):
                    raise ValueError(f"a phase must be [name, steps], got {item!r}") from None
            values["phases"] = tuple(phases)
        for name in ("lora_rank", "batch_size", "grad_accum", "seq_len", "gpus"):
            if name in values:
                values[name] = whole(name, values[name])
        for name in ("total_params_b", "active_params_b", "checkpoint_interval_s", "checkpoint_gb",
                     "model_download_gb", "image_gb", "boot_s", "rent_disk_gb"):
            if name in values:
                values[name] = number(name, values[name])
        for name in ("optimizer", "memory_plan"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"{name} must be text")
        if values.get("vram_needed_gb") is not None:
            values["vram_needed_gb"] = number("vram_needed_gb", values["vram_needed_gb"])
        return cls(**values)


def resolve_kernel_path(recipe_kernel_path: str, compute_capability: int) -> str:
    if recipe_kernel_path != "auto":
        return recipe_kernel_path
    return "grouped_mm" if compute_capability in GROUPED_MM_FAST_CAPABILITIES else "triton"


@dataclass(frozen=True, slots=True)
class MoeShape:
    """The figures of a MoE checkpoint that set what a run moves: its routed experts (the adapter's bulk)."""

    hidden: int
    layers: int
    experts: int
    top_k: int
    moe_intermediate: int
    shared_intermediate: int  # 0: no shared expert
    vocab: int

    def routed_adapter_gb(self, rank: int, bytes_per_value: int = 4) -> float:
        """The routed experts' LoRA factors as saved (float32): gate_up A (r x H) and B (2I x r), down A (r x I) and
        B (H x r), per expert and layer. 35B-A3B at rank 32 gives 7.4 GB (docs/field-notes.md)."""
        per_expert = rank * (self.hidden + 2 * self.moe_intermediate + self.moe_intermediate + self.hidden)
        return self.layers * self.experts * per_expert * bytes_per_value / 1e9


# Published shapes (the models' config.json; docs/field-notes.md for Qwen3.5/3.6).
SHAPES = {
    "Qwen3.6-35B-A3B": MoeShape(hidden=2048, layers=40, experts=256, top_k=8, moe_intermediate=512,
                                shared_intermediate=512, vocab=248_320),
    "Qwen3-30B-A3B": MoeShape(hidden=2048, layers=48, experts=128, top_k=8, moe_intermediate=768,
                              shared_intermediate=0, vocab=151_936),
    "Qwen3-235B-A22B": MoeShape(hidden=4096, layers=94, experts=128, top_k=8, moe_intermediate=1536,
                                shared_intermediate=0, vocab=151_936),
}
SHAPES["Qwen3.5-35B-A3B"] = SHAPES["Qwen3.6-35B-A3B"]  # one family: the same text shape

# What a rank's memory grows by with its micro-step and its LoRA rank, measured once (micro_step_vram_gb says how):
# one H200, the Qwen3-30B-A3B shape, LoRA r=32 on attention and the routed experts, 2 x 2048 tokens a micro-step, no
# gradient checkpointing, the project's trainer: peak reserved 89.2 GiB (peak allocated 76.2 GiB).
CALIBRATION_MODEL = "Qwen3-30B-A3B"
CALIBRATION_RESERVED_GB = 89.2 * 2**30 / 1e9  # 95.8 GB
CALIBRATION_WEIGHTS_GB = 2.0 * 30.5  # BF16 base
CALIBRATION_TOKENS = 2 * 2048  # per micro-step
CALIBRATION_RANK = 32
# Per LoRA parameter: its float32 value (peft keeps adapters in float32 over a BF16 base), its gradient, AdamW's two
# moments. Does not grow with tokens.
ADAPTER_STATE_BYTES = 16
# The rest of the measured peak, per token of a micro-step, per layer and per hidden unit: the activations kept for
# the backward pass and the allocator's cache around them, which grow with the tokens (and the attention adapters'
# state, 0.4 GB at r=32, too small to split out). 95.8 - 61.0 - 20.1 (routed adapter state) = 14.6 GB over
# 4096 tokens x 48 layers x 2048 hidden: about 36 bytes.
ACTIVATION_BYTES = (CALIBRATION_RESERVED_GB - CALIBRATION_WEIGHTS_GB - SHAPES[CALIBRATION_MODEL].routed_adapter_gb(
    CALIBRATION_RANK, ADAPTER_STATE_BYTES)) * 1e9 / (
    CALIBRATION_TOKENS * SHAPES[CALIBRATION_MODEL].layers * SHAPES[CALIBRATION_MODEL].hidden)


def micro_step_vram_gb(recipe: Workload, *, batch_size: int, seq_len: int, lora_rank: int) -> float:
    """What each GPU must hold for a run of `recipe`'s model with its own micro-step and LoRA rank: for a model the
    memory plan knows, its least card at those (fleet/ranking/memory.py); else `recipe.vram_gb`, plus what grows
    with tokens and rank, never less (docs/fleet.md, "Memory per GPU")."""
    own = replace(recipe, batch_size=batch_size, seq_len=seq_len, lora_rank=lora_rank)
    least = memory.least_card_gb(own)
    if least is not None:
        return least
    shape = SHAPES.get(recipe.model, SHAPES[CALIBRATION_MODEL])
    per_token_gb = ACTIVATION_BYTES * shape.layers * shape.hidden / 1e9
    activations_gb = per_token_gb * (batch_size * seq_len - recipe.batch_size * recipe.seq_len)
    adapter_gb = (shape.routed_adapter_gb(lora_rank, ADAPTER_STATE_BYTES)
                  - shape.routed_adapter_gb(recipe.lora_rank, ADAPTER_STATE_BYTES)) / recipe.gpus
    if activations_gb + adapter_gb <= 0:
        return recipe.vram_gb
    return math.ceil((recipe.vram_gb + activations_gb + adapter_gb) * 10) / 10  # up to a tenth: as pages say it

# Starting points the Offers page offers; a user edits and saves their own. Per model: total parameters (the VRAM
# need and, at 2 bytes each, the BF16 download), active parameters (the FLOPs a token costs: 6 per active parameter)
# and the routed-expert adapter each checkpoint uploads. 235B-A22B: 470 GB of BF16 weights that fit no single GPU,
# so it ranks for 4 (H200 or B200; 8 take 80-96 GB cards too); its disk holds the base, a merged and an FP8 copy.
PRESETS = {
    "qwen3.6-35b-a3b": Workload(),
    "qwen3.5-35b-a3b": Workload(model="Qwen3.5-35B-A3B"),
    "qwen3-30b-a3b": Workload(model="Qwen3-30B-A3B", total_params_b=30.5, active_params_b=3.3, model_download_gb=61.0),
    "qwen3-235b-a22b": Workload(model="Qwen3-235B-A22B", total_params_b=235.0, active_params_b=22.0,
                              model_download_gb=470.0, rent_disk_gb=1200.0, gpus=4,
                              checkpoint_gb=round(SHAPES["Qwen3-235B-A22B"].routed_adapter_gb(32), 1)),
}
