"""How a MoE-LoRA run fits on one card: its weights, LoRA factors and gradients, optimizer state, activations, the
chunked head and what is left, for each way to train it (checkpointing, optimizer state), and the plan chosen.
Pure (no torch): the trainer, the ranking and the launch page share it (docs/training.md, "training/memory_plan.py")."""

from dataclasses import dataclass, replace

GIB = 2**30
MEMORY_PLANS = ("auto", "recipe")  # auto: the fastest plan that fits, never less frugal than the recipe says


@dataclass(frozen=True)
class Optimizer:
    """What an optimizer choice costs per LoRA parameter and in speed (against float32 AdamW on the card)."""

    factor_bytes: float  # on the card: the factor and its gradient
    state_bytes: float  # on the card: the optimizer's state
    host_bytes: float  # pinned on the host
    speed: float
    words: str


# peft keeps the factors in float32 over a bf16 base, and so their gradients; the _bf16 choices keep both in bf16 (the
# 8-bit step rounds stochastically, so no update is lost to bf16's coarse grid: training/kernels/adamw8bit.py; the
# host's keeps a float32 copy). AdamW's state is two float32 moments; AdamW8bit (training/optimizers.py) keeps each
# in a byte with a float32 scale per block of 256; the offloaded optimizer keeps them, and a float32 copy of the
# factors, in the host's memory. Speeds: CHECKPOINTING_SPEED's note below.
EIGHT_BIT = 2 * (1 + 4 / 256)
# In the order of what they leave on the card, most first (a recipe's choice is the plan's floor).
OPTIMIZER_FIGURES = {
    "adamw": Optimizer(8, 8.0, 0.0, 1.0, "float32 moments"),
    "adamw_8bit": Optimizer(8, EIGHT_BIT, 0.0, 0.97, "8-bit moments"),
    "adamw_offload": Optimizer(8, 0.0, 4 + 4 + 8, 0.7, "moments on the host"),
    "adamw_8bit_bf16": Optimizer(4, EIGHT_BIT, 0.0, 0.97, "8-bit moments and bf16 factors"),
    "adamw_offload_bf16": Optimizer(4, 0.0, 4 + 4 + 8, 0.75, "moments on the host and bf16 factors"),
}
OPTIMIZERS = tuple(OPTIMIZER_FIGURES)
BF16_FACTORS = frozenset(name for name, figures in OPTIMIZER_FIGURES.items() if figures.factor_bytes == 4)
OFFLOADED = frozenset(name for name, figures in OPTIMIZER_FIGURES.items() if figures.host_bytes)

# What the layers keep for the backward pass, per token, layer and hidden unit, without checkpointing, over the timed
# steps; calibrated on one H200, r=32, 2 x 2048 tokens (tests/training/test_memory_plan.py): Qwen3-30B-A3B 89.2 and
# 90.3 GiB reserved with float32 moments, 83.2 with 8-bit (full attention), Qwen3.6-35B-A3B 108.7 GiB (three DeltaNet
# layers in four on FLA, with the fused Qwen3.5 norms and the short convolution's kernel, graphed; 119.2 before those
# kernels, at 81) and 83.5 with 22 of its 40 layers checkpointed, 8-bit moments and bf16 factors.
ACTIVATION_BYTES = {"attention": 33.6, "linear_attention": 46.0}
# The first step holds more than the timed ones: its eager warm-up, then the CUDA-graph capture (training/graphs.py).
# Plans predicted 78.3 and 75.6 GiB from the timed steps ran out of memory in 80 and 77 GiB budgets, one at 72.7 ran
# in 74 (and float32 factors at 83.1 in 85): 14.5% more, within 1%. Qwen3.6-35B-A3B's first step, graphs captured,
# peaked at its timed steps' reserve on the whole card (108.7 GiB) and in 96 GiB (83.5); with every layer checkpointed
# and the moments on the host, 75.9 in a 76 GiB budget and 77.0 in 80 against 73.8 timed in both: the offloaded
# step's first pass, not activations (1.1 GiB of them), and within the headroom a plan keeps.
FIRST_STEP = {"attention": 1.145, "linear_attention": 1.0}
# The rest of the reserve beside what is counted (allocator blocks, cuBLAS workspaces, the step's small tensors): the
# same 30B-A3B run reserved 89.2 GiB in one lease and 90.3 in another; 1.4 keeps every measured 30B-A3B point within
# 0.7 GiB (0.8 let a plan predicted at 73.8 of 74 GiB run out of memory).
SLACK_GIB = 1.4
CONTEXT_GIB = 0.9  # what the driver and CUDA context keep of a card's memory: a 96 GB card has about 95 GiB usable
# What a run's CUDA work takes beside PyTorch's caching allocator: the Triton kernels it loads (ours, FLA's) and the
# local memory the driver keeps for kernels that spill. The trainer keeps it free by capping the allocator
# (training/fitting.py, `cap_allocator`). On a real 80 GB H100 the 30B-A3B step held 0.82 GiB beside its reserve,
# the CUDA context included. Budgets imposed on an H200 (bench/train_step.py) left the rest of the card to the driver,
# so they never met this; the autotuning candidates that ask for far more are skipped (training/out_of_memory.py).
OUTSIDE_ALLOCATOR_GIB = 1.0
HEAD_CHUNK_TOKENS = 1024  # training/head_loss.py CHUNK_TOKENS: the logits of this many tokens at a time, in bf16

# Throughput of each plan against no checkpointing and float32 moments in the card (one H200, r=32, 8 x 2 x 2048
# tokens). Checkpointing recomputes every layer's forward: 16,601 against 22,684 tokens/s on 30B-A3B (0.73). Our 8-bit
# step (training/kernels/adamw8bit.py) takes 36 ms against fused AdamW's 14.5 on 30B-A3B's adapter; with it, no
# checkpointing 21,725 tokens/s (0.958), half the layers checkpointed 18,687 (0.824 of 22,684: 0.97 x 0.850), three
# quarters 17,668, all 16,315 (0.719): 0.97 over all four. Qwen3.6-35B-A3B, on its norm and convolution kernels,
# loses less to recomputing (why is not measured: its step has a 248k-word head that is not redone): 22 of 40 layers
# with 8-bit moments and bf16 factors 14,944 against 17,520 (0.853 = 0.97 / (1 + (1 / 0.80 - 1) x 0.55)); every layer
# with the moments on the host and bf16 factors 10,499 (0.599 = 0.75 x 0.80: the offloaded step copies the gradients
# out and the factors back over PCIe and steps on the host's cores). Before those kernels, every layer with float32
# moments measured 0.73 (8,735 against 11,961). With float32 factors, twice the bytes cross: 0.7, not measured.
CHECKPOINTING_SPEED = {"attention": 0.74, "linear_attention": 0.80}
# What a chosen plan leaves free beyond its predicted reserve. The prediction's own error is in SLACK_GIB; this is for
# what a run of hours meets that the timed steps did not: the allocator's fragmentation, a longer DPO pair's bucket, a
# driver with a bigger context. 6 GiB: the practitioners' 96 GB card (95.1 usable) keeps its run within 89.1, an 80 GB
# one (79.1) within 73.1; a card of under 60 GiB keeps a tenth.
HEADROOM_GIB, HEADROOM_SHARE = 6.0, 0.1


@dataclass(frozen=True)
class ModelShape:
    """The figures of a MoE model that set its memory; widths are the sums of (in + out) features of the modules
    LoRA targets in one decoder layer by default (training/families.py), averaged over the layers."""

    total_params_b: float
    layers: int
    hidden: int
    experts: int
    moe_intermediate: int
    vocab: int
    linear_attention: bool  # some layers are Gated DeltaNet
    attention_lora_width: int  # attention and linear attention (`lora.attention: false` drops them)
    other_lora_width: int = 0  # the shared expert

    def lora_params(self, rank: int, attention: bool = True) -> int:
        """Trainable parameters at LoRA rank `rank`: every routed expert's gate_up and down, and the modules."""
        routed = self.experts * (2 * self.hidden + 3 * self.moe_intermediate)
        modules = (self.attention_lora_width if attention else 0) + self.other_lora_width
        return self.layers * rank * (routed + modules)


# Published shapes (each model's config.json). Qwen3.5/3.6: 10 full-attention layers (gated q 2 x 16 x 256, 2 KV
# heads) and 30 DeltaNet layers (qkv 8192, z 4096, b and a 32, out 4096 -> 2048) of 40, and a shared expert of 512.
SHAPES = {
    "Qwen3.6-35B-A3B": ModelShape(total_params_b=35.0, layers=40, hidden=2048, experts=256, moe_intermediate=512,
                                  vocab=248_320, linear_attention=True, attention_lora_width=25_392,
                                  other_lora_width=3 * (2048 + 512)),
    "Qwen3-30B-A3B": ModelShape(total_params_b=30.5, layers=48, hidden=2048, experts=128, moe_intermediate=768,
                                vocab=151_936, linear_attention=False, attention_lora_width=17_408),
    "Qwen3-235B-A22B": ModelShape(total_params_b=235.0, layers=94, hidden=4096, experts=128, moe_intermediate=1536,
                                  vocab=151_936, linear_attention=False, attention_lora_width=33_792),
}
SHAPES["Qwen3.5-35B-A3B"] = SHAPES["Qwen3.6-35B-A3B"]


@dataclass(frozen=True)
class Run:
    """What one rank of a run holds: the model's shape, the LoRA rank and targets, tokens per micro-step, and the
    GPUs of the box that share the weights and the adapters (training/distributed.py). `lora_params` and
    `weights_bytes`, when given, are counted on the model itself (the trainer) instead of from the shape."""

    shape: ModelShape
    lora_rank: int = 32
    attention: bool = True
    tokens: int = 2 * 2048
    gpus: int = 1
    lora_params: int | None = None
    weights_bytes: int | None = None


@dataclass(frozen=True)
class Plan:
    """One way to train a run on a card, in GiB per GPU; `card_gib` is what the card leaves usable."""

    checkpointed: int  # decoder layers recomputed in the backward (0: none; `layers`: every one)
    layers: int
    optimizer: str
    checkpointing_speed: float  # CHECKPOINTING_SPEED of the model's kind of layers
    weights_gib: float
    lora_gib: float  # the factors and their gradients
    optimizer_gib: float
    activations_gib: float
    head_gib: float
    slack_gib: float
    host_gib: float  # the host memory an offloaded optimizer pins
    card_gib: float
    kept_gib: float  # the headroom it was chosen to leave (`kept_gib`; 0 within a retry's budget)

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.lora_gib + self.optimizer_gib + self.activations_gib + self.head_gib \
            + self.slack_gib

    @property
    def headroom_gib(self) -> float:
        return self.card_gib - self.total_gib

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= 0

    @property
    def roomy(self) -> bool:
        """It leaves the headroom kept, not only fits."""
        return leaves(self.total_gib, self.card_gib, self.kept_gib)

    @property
    def checkpointing(self) -> bool:
        return self.checkpointed > 0

    @property
    def speed(self) -> float:
        """Its throughput against the plain plan's (no checkpointing, float32 moments in the card): each checkpointed
        layer's share of checkpointing's extra time (CHECKPOINTING_SPEED)."""
        share = self.checkpointed / self.layers if self.layers else 0.0
        return OPTIMIZER_FIGURES[self.optimizer].speed / (1.0 + (1.0 / self.checkpointing_speed - 1.0) * share)

    @property
    def name(self) -> str:
        if 0 < self.checkpointed < self.layers:
            return f"checkpointing {self.checkpointed} of {self.layers} layers, " \
                f"{OPTIMIZER_FIGURES[self.optimizer].words}"
        return plan_name(self.checkpointing, self.optimizer)

    def to_dict(self) -> dict:
        """The plan as the trainer's log, the metrics and the pages say it (GiB to a tenth)."""
        figures = {key: round(getattr(self, key), 1) for key in (
            "weights_gib", "lora_gib", "optimizer_gib", "activations_gib", "head_gib", "slack_gib", "host_gib",
            "card_gib", "total_gib", "headroom_gib", "kept_gib")}
        return {"plan": self.name, "checkpointing": self.checkpointing, "checkpointed_layers": self.checkpointed,
                "optimizer": self.optimizer, "roomy": self.roomy,
                "speed": round(self.speed, 3), "fits": self.fits, **figures}


def plan_name(checkpointing: bool, optimizer: str) -> str:
    return f"{'checkpointing' if checkpointing else 'no checkpointing'}, {OPTIMIZER_FIGURES[optimizer].words}"


def usable_gib(card_gib: float) -> float:
    """What a card of `card_gib` (its total memory, as a listing or torch says it) leaves for a run's allocator: less
    the CUDA context and what the run's kernels take outside the allocator."""
    return max(0.0, card_gib - CONTEXT_GIB - OUTSIDE_ALLOCATOR_GIB)


def card_gib_for(usable: float) -> float:
    """The card memory (total, GiB) that leaves `usable` GiB for a run's allocator: `usable_gib`'s inverse."""
    return usable + CONTEXT_GIB + OUTSIDE_ALLOCATOR_GIB


def kept_gib(usable: float) -> float:
    """The headroom a plan is chosen to leave on a card with `usable` GiB: HEADROOM_GIB, a tenth of a small card."""
    return min(HEADROOM_GIB, HEADROOM_SHARE * usable)


def leaves(total_gib: float, usable: float, kept: float) -> bool:
    """A plan of `total_gib` on a card with `usable` GiB leaves `kept` free (to rounding)."""
    return usable - total_gib >= kept - 1e-9


def roomy_from(total_gib: float) -> float:
    """The least usable GiB on which a plan of `total_gib` leaves the headroom kept (`kept_gib`)."""
    return min(total_gib + HEADROOM_GIB, total_gib / (1.0 - HEADROOM_SHARE))


def layer_kind(shape: ModelShape) -> str:
    """The key of the calibration tables for a model's layers."""
    return "linear_attention" if shape.linear_attention else "attention"


def layer_activation_bytes(run: Run) -> float:
    """What one layer keeps for the backward pass over a micro-step, without checkpointing, at its first step's."""
    kind = layer_kind(run.shape)
    return ACTIVATION_BYTES[kind] * FIRST_STEP[kind] * run.tokens * run.shape.hidden


def estimate(run: Run, checkpointing: bool | float, optimizer: str, card_gib: float, keep: bool = True) -> Plan:
    """The memory of `run` trained with this checkpointing (True: every layer; a share of the layers) and optimizer
    on a card with `card_gib` usable; `keep` false: a budget already under a plan that left the headroom, which keeps
    none beside."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    shape = run.shape
    params = run.lora_params if run.lora_params is not None else shape.lora_params(run.lora_rank, run.attention)
    weights = run.weights_bytes if run.weights_bytes is not None else shape.total_params_b * 1e9 * 2
    per_layer = layer_activation_bytes(run)
    checkpointed = round(float(checkpointing) * shape.layers)
    # a checkpointed layer keeps its input, and one at a time holds its activations again in the recomputation
    activations = run.tokens * shape.hidden * 2 * checkpointed + per_layer * (shape.layers - checkpointed) \
        + (per_layer if checkpointed else 0)
    head = min(run.tokens, HEAD_CHUNK_TOKENS) * shape.vocab * 2 + run.tokens * shape.hidden * 2
    lora_share = params / run.gpus  # the routed experts by expert parallelism, the rest by FSDP
    figures = OPTIMIZER_FIGURES[optimizer]
    return Plan(checkpointed=checkpointed, layers=shape.layers, optimizer=optimizer,
                checkpointing_speed=CHECKPOINTING_SPEED[layer_kind(shape)],
                weights_gib=weights / run.gpus / GIB, lora_gib=lora_share * figures.factor_bytes / GIB,
                optimizer_gib=lora_share * figures.state_bytes / GIB,
                activations_gib=activations / GIB, head_gib=head / GIB, slack_gib=SLACK_GIB,
                host_gib=lora_share * figures.host_bytes / GIB, card_gib=card_gib,
                kept_gib=kept_gib(card_gib) if keep else 0.0)


def candidates(optimizer: str = "adamw", checkpointing: bool = False, mode: str = "auto", gpus: int = 1,
               layers: int = 4) -> list[tuple[float, str]]:
    """The (share of the `layers` decoder layers checkpointed, optimizer) pairs to try, in order: OPTIMIZERS' order,
    and fewer checkpointed layers before more within each (every count); none less frugal than the recipe's own
    settings. `mode` "recipe": the recipe's settings only. Several GPUs: the recipe's optimizer only."""
    if mode == "recipe":
        return [(float(checkpointing), optimizer)]
    allowed = OPTIMIZERS[OPTIMIZERS.index(optimizer):] if gpus == 1 else (optimizer,)
    shares = (1.0,) if checkpointing else tuple(count / layers for count in range(layers + 1))
    return [(share, opt) for opt in allowed for share in shares]


def plans(run: Run, usable: float, optimizer: str = "adamw", checkpointing: bool = False,
          mode: str = "auto", host_gib: float | None = None, keep: bool = True) -> list[Plan]:
    """Every candidate plan with `usable` GiB (`usable_gib` of a listed card; a budget as it is), in the order they
    are tried; with `host_gib` (the host memory free; 0 on a CPU run: no host to offload to) only those whose
    optimizer's state fits there. `keep`: `estimate`'s."""
    found = [estimate(run, ckpt, opt, usable, keep)
             for ckpt, opt in candidates(optimizer, checkpointing, mode, run.gpus, run.shape.layers)]
    return [plan for plan in found if host_gib is None or plan.host_gib <= host_gib]


def choose(run: Run, usable: float, optimizer: str = "adamw", checkpointing: bool = False,
           mode: str = "auto", host_gib: float | None = None, keep: bool = True) -> Plan | None:
    """The fastest candidate that leaves the headroom kept in `usable` GiB (`kept_gib`; within `host_gib`: `plans`;
    the first of equals); where none does, the one that fits with the most headroom; None where none fits."""
    return pick(plans(run, usable, optimizer, checkpointing, mode, host_gib, keep), usable,
                kept_gib(usable) if keep else 0.0)


def pick(found: list[Plan], usable: float, kept: float) -> Plan | None:
    """`choose`'s rule over plans already counted, for a card with `usable` GiB that keeps `kept` free."""
    fitting = [plan for plan in found if plan.total_gib <= usable]
    roomy = [plan for plan in fitting if leaves(plan.total_gib, usable, kept)]
    if roomy:
        return max(roomy, key=lambda plan: plan.speed)
    return min(fitting, key=lambda plan: plan.total_gib, default=None)


def take(run: Run, usable: float, optimizer: str = "adamw", checkpointing: bool = False,
         host_gib: float | None = None, keep: bool = True) -> Plan:
    """What a run trains with: `choose`'s plan, or where none fits the most frugal (its `fits` false; within the
    host where any is), which may still run out of memory."""
    return choose(run, usable, optimizer, checkpointing, host_gib=host_gib, keep=keep) or (
        plans(run, usable, optimizer, checkpointing, host_gib=host_gib, keep=keep)
        or plans(run, usable, optimizer, checkpointing, keep=keep)
    )[-1]


def smallest_card_gib(run: Run, optimizer: str = "adamw", checkpointing: bool = False, mode: str = "auto") -> float:
    """The least card memory (total, GiB) any candidate fits in."""
    return card_gib_for(min(p.total_gib for p in plans(run, 0.0, optimizer, checkpointing, mode)))


def steps(run: Run, optimizer: str = "adamw", checkpointing: bool = False,
          mode: str = "auto") -> list[tuple[float, Plan]]:
    """(least card GiB, plan) for each plan some card would choose, smallest card first: a card of at least that
    memory, and less than the next entry's, runs that plan (a faster one the more memory it has). A plan's first card
    is where it fits or where it leaves the headroom kept (`roomy_from`)."""
    found: list[tuple[float, Plan]] = []
    counted = plans(run, 0.0, optimizer, checkpointing, mode)
    totals = {plan.total_gib for plan in counted}
    for need in sorted(totals | {roomy_from(total) + 1e-9 for total in totals}):
        plan = pick(counted, need, kept_gib(need))  # a card with just `need` usable
        if plan is not None and (not found or plan.speed > found[-1][1].speed):
            found.append((card_gib_for(need), replace(plan, card_gib=need, kept_gib=kept_gib(need))))
    return found


def shape_from_config(config, linear_attention: bool) -> ModelShape:
    """The shape of a transformers MoE config (its text config for a multimodal one); the LoRA widths are left 0:
    the trainer counts its parameters on the model itself (`Run.lora_params`)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or 1
    return ModelShape(total_params_b=0.0, layers=text.num_hidden_layers, hidden=text.hidden_size, experts=experts,
                      moe_intermediate=getattr(text, "moe_intermediate_size", 0) or 0, vocab=text.vocab_size,
                      linear_attention=linear_attention, attention_lora_width=0)
