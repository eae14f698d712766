"""The metric record of one training step, each field named once with its unit, from trainer to charts; plain Python
(docs/training.md, "training/metric_fields.py")."""

import math
from dataclasses import dataclass
from datetime import UTC, datetime

PHASE, STEP, AT = "phase", "step", "at"  # the key (phase index, step) and when the step finished (ISO 8601, UTC)
KEY_LIMITS = {PHASE: 100, STEP: 10_000_000}


@dataclass(frozen=True)
class MetricField:
    name: str
    kind: type  # float, int or str
    label: str  # what a chart axis or a column header says
    minimum: float | None = 0.0  # None: no bound below
    maximum: float | None = None  # every number of FIELDS has one (below)
    max_length: int = 0  # text only
    enveloped: bool = False  # charted per phase with a min/max envelope when downsampled


# Every number has a largest value, so that no sum or mean the pages take over stored points can overflow
# PostgreSQL's float8 (avg(step_s) over two points of 1e308 fails every page that shows the run). Each is past anything
# a real run reports, so a point over one comes from a broken or hostile box and is refused with a 422.
# Losses and norms: above the largest finite float32 (and bfloat16), about 3.4e38, so any finite value a trainer
# computes in them is taken, however far a run diverges.
LARGEST_NORM = 1e39
LARGEST_LR = 10.0  # a recipe's learning rate is at most 1.0 (training/recipe.py LIMITS)
WEEK_S = 7 * 24 * 3600.0  # one step; a box that takes longer has hung
LARGEST_TOKENS_PER_S = 1e9  # a hundred times and more what any box of GPUs trains at
# The router's load (training/router_load.py): at most this many MoE layers and experts a layer, each expert's count of
# (token, choice) pairs in one interval at most ROUTER_MAX_COUNT. ROUTER_LOAD is the record's matrix, not a column.
ROUTER_LOAD, ROUTER_MAX_LAYERS, ROUTER_MAX_EXPERTS, ROUTER_MAX_COUNT = "router_load", 256, 1024, 10**15
# Each phase kind's own figures (training/losses.py), as TRL names and computes them. A reward is beta times the
# log-prob's gain over the reference (bounded as a loss is); a GRPO reward is whatever the phase's function returns.
SIGNED: dict = {"minimum": -LARGEST_NORM, "maximum": LARGEST_NORM, "enveloped": True}
SHARE: dict = {"maximum": 1.0, "enveloped": True}
LARGEST_COMPLETION = 65_536  # tokens: a recipe's max_new_tokens at most (training/recipe.py LIMITS)
PHASE_KIND_FIELDS = (
    MetricField("rewards_chosen", float, "reward of the chosen (DPO) or desirable (KTO) completions", **SIGNED),
    MetricField("rewards_rejected", float, "reward of the rejected (DPO) or undesirable (KTO) completions", **SIGNED),
    MetricField("rewards_accuracy", float, "share of pairs whose chosen reward is the higher (DPO)", **SHARE),
    MetricField("rewards_margin", float, "chosen minus rejected reward", **SIGNED),
    MetricField("kl", float, "KL to the reference (KTO: its estimate; GRPO: to the adapter-off model)",
                maximum=LARGEST_NORM, enveloped=True),
    MetricField("reward_mean", float, "GRPO reward, mean over the completions", **SIGNED),
    MetricField("reward_std", float, "GRPO reward spread within a group, mean over the groups", maximum=LARGEST_NORM,
                enveloped=True),
    MetricField("completion_length", float, "GRPO completion length (tokens)", maximum=LARGEST_COMPLETION,
                enveloped=True),
    MetricField("zero_spread_groups", float, "share of GRPO groups whose rewards do not vary", **SHARE),
)
# Validation on a phase's held-out records (training/validation.py), at its eval_every steps and its end: the same
# figures as its training ones, "eval_" before the name; eval_s is the time the validation took.
HELD_OUT_FIELDS = (
    MetricField("eval_loss", float, "held-out loss", maximum=LARGEST_NORM, enveloped=True),
    MetricField("eval_perplexity", float, "held-out perplexity (CPT)", minimum=1.0, maximum=LARGEST_NORM,
                enveloped=True),
    MetricField("eval_rewards_chosen", float, "held-out reward of the chosen / desirable completions", **SIGNED),
    MetricField("eval_rewards_rejected", float, "held-out reward of the rejected / undesirable completions",
                **SIGNED),
    MetricField("eval_rewards_accuracy", float, "held-out share of pairs ranked right (DPO)", **SHARE),
    MetricField("eval_rewards_margin", float, "held-out chosen minus rejected reward", **SIGNED),
    MetricField("eval_reward_mean", float, "held-out GRPO reward, mean over the prompts (greedy)", **SIGNED),
    MetricField("eval_reward_std", float, "held-out GRPO reward spread over the prompts", maximum=LARGEST_NORM,
                enveloped=True),
    MetricField("eval_s", float, "validation time (s)", maximum=WEEK_S),
)
FIELDS = (
    MetricField("loss", float, "loss", minimum=-LARGEST_NORM, maximum=LARGEST_NORM, enveloped=True),
    MetricField("lr", float, "learning rate", maximum=LARGEST_LR),
    MetricField("step_s", float, "step time (s)", maximum=WEEK_S, enveloped=True),
    MetricField("tokens_per_s", float, "tokens per second", maximum=LARGEST_TOKENS_PER_S, enveloped=True),
    MetricField("grad_norm_routed", float, "routed-expert LoRA gradient norm", maximum=LARGEST_NORM, enveloped=True),
    MetricField("grad_norm_attention", float, "attention LoRA gradient norm", maximum=LARGEST_NORM, enveloped=True),
    MetricField("grad_norm_linear_attention", float, "linear-attention (DeltaNet) LoRA gradient norm",
                maximum=LARGEST_NORM, enveloped=True),
    MetricField("grad_norm_shared_expert", float, "shared-expert LoRA gradient norm", maximum=LARGEST_NORM,
                enveloped=True),
    MetricField("grad_norm_total", float, "total gradient norm", maximum=LARGEST_NORM),
    MetricField("routed_b_norm", float, "routed-expert LoRA B norm", maximum=LARGEST_NORM, enveloped=True),
    MetricField("routed_b_zero", int, "routed-expert LoRA B tensors still zero", maximum=10_000_000, enveloped=True),
    MetricField("router_max_mean", float, "router load: busiest expert over the mean, worst layer",
                maximum=ROUTER_MAX_EXPERTS, enveloped=True),
    MetricField("router_idle_experts", int, "routed experts that got no token (layer x expert)",
                maximum=ROUTER_MAX_LAYERS * ROUTER_MAX_EXPERTS, enveloped=True),
    MetricField("gpu_mem_gib", float, "GPU memory the trainer holds (GiB)", maximum=10_000),
    *PHASE_KIND_FIELDS,
    *HELD_OUT_FIELDS,
    MetricField("kernel_path", str, "experts kernel path", max_length=20),
)
NAMES = tuple(f.name for f in FIELDS)
ENVELOPED = tuple(f.name for f in FIELDS if f.enveloped)


def _finite(value) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def wire_point(record: dict) -> dict:
    """What the agent posts for one record of metrics.jsonl: the key, the time, the fields the record has, and its
    router load matrix where it has one (the dashboard checks its shape)."""
    finished = record.get("time")
    point = {PHASE: record[PHASE], STEP: record[STEP],
             AT: datetime.fromtimestamp(finished, tz=UTC).isoformat() if finished is not None else None}
    # NaN or infinity (a diverged step's loss or gradient norm) is no figure to chart: sent as not measured, since
    # JSON has no way to say it and the dashboard refuses it.
    point.update({name: record[name] for name in NAMES if record.get(name) is not None and _finite(record[name])})
    if record.get(ROUTER_LOAD) is not None:
        point[ROUTER_LOAD] = record[ROUTER_LOAD]
    return point
