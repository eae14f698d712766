"""The fine-tune a user ranks offers for.

The ranking prices a whole run, not an hour, so the recipe carries everything that turns a step time into money:
the work per step (tokens and active parameters), the number of steps, how often and how big the checkpoints are
(uploads and the work a lost host throws away), and what a fresh box must fetch before its first step (billed
start-up minutes and download traffic).
"""

from dataclasses import asdict, dataclass, fields

from .values import number, whole

KERNEL_PATHS = ("auto", "grouped_mm", "triton")

# Compute capabilities where torch._grouped_mm takes its CUTLASS path (sm_90 Hopper, sm_100 B200). Elsewhere it falls
# back to a host sync and one matmul per group, so "auto" picks the project's Triton grouped GEMM there.
GROUPED_MM_FAST_CAPABILITIES = frozenset({90, 100})


@dataclass(frozen=True, slots=True)
class Phase:
    name: str  # "cpt", "sft", "dpo", "kto", "grpo"
    steps: int


@dataclass(frozen=True, slots=True)
class Recipe:
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
    )  # about 20 h on an H200, the seed report's full run
    kernel_path: str = "auto"  # "auto" resolves per GPU architecture, see resolve_kernel_path
    checkpoint_interval_s: float = 1800.0
    checkpoint_gb: float = 7.4  # routed-expert adapter at rank 32 (seed report); attention adapter is small
    model_download_gb: float = 67.0  # BF16 base
    image_gb: float = 12.0  # worker image pulled at the host's downlink
    boot_s: float = 120.0  # rent -> container running, before the image pull and model download
    rent_disk_gb: float = 250.0  # disk rented with the box: base + merged BF16 copy + FP8 copy
    vram_needed_gb: float | None = None  # per GPU; None: BF16 weights plus headroom, see vram_gb

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
        # BF16 base (2 bytes a parameter) plus adapters, optimizer state and activations at these batch sizes; 35B
        # gives 85 GB, what the seed report measured for a 30B vanilla-peft run that OOMed on an 80 GB card.
        if self.vram_needed_gb is not None:
            return self.vram_needed_gb
        return 2.0 * self.total_params_b + 15.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["phases"] = [[p.name, p.steps] for p in self.phases]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Recipe":
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
        for name in ("lora_rank", "batch_size", "grad_accum", "seq_len"):
            if name in values:
                values[name] = whole(name, values[name])
        for name in ("total_params_b", "active_params_b", "checkpoint_interval_s", "checkpoint_gb",
                     "model_download_gb", "image_gb", "boot_s", "rent_disk_gb"):
            if name in values:
                values[name] = number(name, values[name])
        if values.get("vram_needed_gb") is not None:
            values["vram_needed_gb"] = number("vram_needed_gb", values["vram_needed_gb"])
        return cls(**values)


def resolve_kernel_path(recipe_kernel_path: str, compute_capability: int) -> str:
    if recipe_kernel_path != "auto":
        return recipe_kernel_path
    return "grouped_mm" if compute_capability in GROUPED_MM_FAST_CAPABILITIES else "triton"


# Starting points the Offers page offers; a user edits and saves their own.
PRESETS = {
    "qwen3.6-35b-a3b": Recipe(),
    "qwen3-30b-a3b": Recipe(model="Qwen3-30B-A3B", total_params_b=30.5, active_params_b=3.3, model_download_gb=61.0),
}
