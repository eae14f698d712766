"""Which modules of each model family get LoRA by default, grouped as the metrics and the step-1 guard see them
(docs/training.md, "training/families.py")."""

import re
from dataclasses import dataclass, field

ROUTED = "routed"
# The groups whose gradient norms are reported apart (metric_fields: grad_norm_<group>) and guarded apart.
MODULE_GROUPS = ("attention", "linear_attention", "shared_expert")
GROUPS = (ROUTED, *MODULE_GROUPS)
ROUTED_PARAMETERS = ("experts.gate_up_proj", "experts.down_proj")
TOKEN_MIXERS = ("attention", "linear_attention")  # what `lora.attention: false` turns off
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
SHARED_EXPERT = ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type of the checkpoint or of its text config
    targets: dict = field(default_factory=dict)  # group -> module paths within a decoder layer
    frozen: tuple[str, ...] = ()  # never targeted (documentation, and checked by the tests)

    @property
    def linear_attention(self) -> bool:
        """Whether some layers are Gated DeltaNet: packed rows then need the sample boundaries at those layers."""
        return bool(self.targets.get("linear_attention"))


FAMILIES = (
    Family("qwen3_moe", ("qwen3_moe",), {"attention": ATTENTION},
           frozen=("mlp.gate", "input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")),
    Family("qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text"), {
        "attention": ATTENTION,
        "linear_attention": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                             "linear_attn.in_proj_a", "linear_attn.out_proj"),
        "shared_expert": SHARED_EXPERT,
    }, frozen=("mlp.gate", "mlp.shared_expert_gate", "linear_attn.conv1d", "linear_attn.norm", "linear_attn.A_log",
               "linear_attn.dt_bias", "input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
               "self_attn.k_norm")),
    Family("qwen3_next", ("qwen3_next",), {
        "attention": ATTENTION,
        "linear_attention": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj"),
        "shared_expert": SHARED_EXPERT,
    }, frozen=("mlp.gate", "mlp.shared_expert_gate", "linear_attn.conv1d", "linear_attn.norm", "linear_attn.A_log",
               "linear_attn.dt_bias", "input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
               "self_attn.k_norm")),
    Family("qwen2_moe", ("qwen2_moe",), {"attention": ATTENTION, "shared_expert": SHARED_EXPERT},
           frozen=("mlp.gate", "mlp.shared_expert_gate", "input_layernorm", "post_attention_layernorm")),
)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def _model_types(config):
    types = [getattr(config, "model_type", None)]
    text = getattr(config, "text_config", None)
    if text is not None:
        types.append(getattr(text, "model_type", None))
    return types


def find_family(config) -> Family | None:
    """The family of a transformers config (a multimodal config is read by its text config's model type too)."""
    return next((_BY_MODEL_TYPE[t] for t in _model_types(config) if t in _BY_MODEL_TYPE), None)


def family_named(model_type: str) -> Family | None:
    """The family of a model type as a config names it ("qwen3_5_moe", "qwen3_5_moe_text"), or None."""
    return _BY_MODEL_TYPE.get(model_type)


def family_of(config) -> Family:
    """find_family, or a clear error for a model type the table does not know."""
    family = find_family(config)
    if family is not None:
        return family
    types = _model_types(config)
    known = ", ".join(sorted(_BY_MODEL_TYPE))
    raise ValueError(f"no LoRA target table for model type {' / '.join(str(t) for t in types)} (known: {known}); "
                     "add the family to training/families.py")


def target_problems(targets) -> list[str]:
    """What is wrong with a recipe's `lora.targets` (a mapping group -> module paths), as recipe problems."""
    if targets is None:
        return []
    if not isinstance(targets, dict):
        return ["lora.targets: a mapping of group -> list of module paths (e.g. {shared_expert: []})"]
    problems = []
    for group, paths in targets.items():
        if group not in MODULE_GROUPS:
            problems.append(f"lora.targets: unknown group {group!r} (known: {', '.join(MODULE_GROUPS)}; the routed "
                            "experts are always targeted)")
        elif not isinstance(paths, list) or not all(isinstance(p, str) and _PATH.match(p) for p in paths):
            problems.append(f"lora.targets.{group}: a list of module paths within a decoder layer "
                            f"(such as 'self_attn.q_proj'), got {paths!r}")
    return problems


def module_targets(family: Family, overrides=None, attention=True) -> dict:
    """group -> module paths to put LoRA on: the family's, each group replaced by the recipe's where it gives one."""
    targets = {group: tuple(family.targets.get(group, ())) for group in MODULE_GROUPS}
    for group, paths in (overrides or {}).items():
        targets[group] = tuple(paths)
    if not attention:
        targets.update({group: () for group in TOKEN_MIXERS})
    return {group: paths for group, paths in targets.items() if paths}


def target_modules_pattern(targets: dict) -> str | None:
    """peft's `target_modules` as one regular expression (peft full-matches it against each module's name): the
    given paths inside a decoder layer, nothing else. None when no module is targeted."""
    paths = sorted({path for group_paths in targets.values() for path in group_paths})
    if not paths:
        return None
    return r"(?:.*\.)?layers\.\d+\.(?:" + "|".join(re.escape(p) for p in paths) + ")"


def group_of(module_name: str, targets: dict) -> str | None:
    """The group a LoRA-wrapped module belongs to, by its path within its decoder layer."""
    for group, paths in targets.items():
        if any(re.search(r"(?:^|\.)layers\.\d+\." + re.escape(path) + "$", module_name) for path in paths):
            return group
    return None
