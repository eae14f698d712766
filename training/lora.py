"""LoRA on the family's module targets (peft's own layers) and on the routed experts (peft's parameter layout, our
forward) (docs/training.md, "training/lora.py")."""

import torch
from peft import LoraConfig, get_peft_model, inject_adapter_in_model
from peft.tuners.lora.layer import LoraLayer, ParamWrapper

from training import families
from training.linear_attention import use_segmented_linear_attention
from training.lora_linear import LoraLinear
from training.moe_lora import IMPLEMENTATION_NAME, Kernels, register, set_kernels, use_moe_lora
from training.attention import use_packed_attention
from training.norms import use_fused_rms_norms
from training.rope import use_fused_rope
from training.routers import use_fused_routers

EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")
TARGETS_ATTRIBUTE = "_lora_targets"


class RoutedExpertsLora(ParamWrapper):
    """peft's ParamWrapper for a 3-D expert parameter, minus the per-call W + BA fold. Same state, same keys."""

    @classmethod
    def adopt(cls, wrapper):
        """Turn a ParamWrapper that peft built into this class (peft's injection accepts only its own class name,
        so the wrappers are made by peft and converted after) and let the experts module find it."""
        wrapper.__class__ = cls
        # A plain dict, so the wrappers are not registered as submodules of the experts (no state-dict change).
        wrapper.get_base_layer().__dict__.setdefault("_routed_lora", {})[wrapper.parameter_name] = wrapper
        return wrapper

    def forward(self, x, *args, **kwargs):
        return self.get_base_layer()(x, *args, **kwargs)


def routed_experts_modules(model):
    """(name, module) of every routed-experts module (3-D gate_up_proj and down_proj parameters)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, ParamWrapper):
            continue
        gate_up = module._parameters.get("gate_up_proj")
        down = module._parameters.get("down_proj")
        if gate_up is not None and down is not None and gate_up.dim() == 3:
            found.append((name, module))
    return found


def _experts_wrappers(model):
    experts_ids = {id(module) for _, module in routed_experts_modules(model)}
    return [m for m in model.modules() if isinstance(m, ParamWrapper) and id(m.get_base_layer()) in experts_ids]


def routed_lora_wrappers(model):
    """(experts name, parameter name, wrapper) for every routed-expert LoRA wrapper in the model, whether its
    forward is ours or still peft's (the benchmark's baseline reports the same gradient norms)."""
    names = {id(module): name for name, module in routed_experts_modules(model)}
    return [
        (names[id(wrapper.get_base_layer())], wrapper.parameter_name, wrapper) for wrapper in _experts_wrappers(model)
    ]


def routed_lora_parameters(model):
    """name -> parameter of the routed-expert LoRA factors (what the step-1 guard checks, apart from attention)."""
    params = {}
    for name, param_name, wrapper in routed_lora_wrappers(model):
        for adapter, layer in wrapper.lora_A.items():
            params[f"{name}.{param_name}.lora_A.{adapter}"] = layer.weight
        for adapter, layer in wrapper.lora_B.items():
            params[f"{name}.{param_name}.lora_B.{adapter}"] = layer.weight
    return params


def lora_config(r=32, alpha=64, targets=None):
    """peft's LoraConfig: LoRA on `targets` (group -> module paths within a decoder layer, `families.module_targets`;
    None: none) and on the routed experts."""
    pattern = families.target_modules_pattern(targets or {})
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=pattern if pattern is not None else [],
        target_parameters=[f"experts.{name}" for name in EXPERT_PARAMETERS],
    )


def model_targets(model, overrides=None, attention=True):
    """group -> module paths for this model: its family's defaults (those the model has: a model cut to a few
    layers may have no attention layer), the recipe's `lora.targets` over them. Every path a recipe gives must name
    a module of the model, so a typo or a path from another family fails here, not silently."""
    targets = families.module_targets(families.family_of(model.config), overrides, attention)
    names = [name for name, _ in model.named_modules()]
    found = {}
    for group, paths in targets.items():
        for path in paths:
            if any(families.group_of(name, {group: (path,)}) for name in names):
                found.setdefault(group, []).append(path)
            elif path in (overrides or {}).get(group, ()):
                raise ValueError(f"LoRA target {group}: {path!r} names no module of this {model.config.model_type} "
                                 "model (paths are within a decoder layer, such as 'self_attn.q_proj')")
    return {group: tuple(paths) for group, paths in found.items()}


def attach_lora(model, r=32, alpha=64, attention=True, targets=None):
    """Wrap a transformers MoE model with peft LoRA on its family's targets and the routed experts; the experts run
    "moe_lora". targets: the recipe's `lora.targets` overrides (group -> module paths), or None.

    Returns the PeftModel (its `save_pretrained` writes a standard peft adapter)."""
    experts = routed_experts_modules(model)
    if not experts:
        raise ValueError("the model has no routed experts with 3-D gate_up_proj / down_proj parameters")
    resolved = model_targets(model, targets, attention)
    peft_model = get_peft_model(model, lora_config(r, alpha, resolved))
    peft_model.__dict__[TARGETS_ATTRIBUTE] = resolved  # a plain attribute: not in the state dict, not a submodule
    use_moe_lora(peft_model.get_base_model())
    adopt_routed_lora(peft_model)
    for module in peft_model.modules():
        LoraLinear.adopt(module)  # module targets: peft's layers, fused forward
    use_fused_rms_norms(peft_model)  # the frozen norms on one Triton kernel each way (on a GPU)
    use_fused_routers(peft_model)  # softmax, top-k and renormalisation after each router's linear, likewise
    use_fused_rope(peft_model)  # the rotary embedding of queries and keys, likewise
    use_segmented_linear_attention(peft_model)  # DeltaNet keeps packed samples apart
    use_packed_attention(peft_model)  # causal attention without a mask, packed samples kept apart
    return peft_model


def module_lora_parameters(model):
    """group -> {name: parameter} of the LoRA factors on the module targets (attention, linear attention, shared
    expert), by the targets `attach_lora` resolved."""
    targets = model.__dict__.get(TARGETS_ATTRIBUTE, {})
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or isinstance(module, ParamWrapper):
            continue
        group = families.group_of(name, targets) or "other"
        for adapter, layer in module.lora_A.items():
            found.setdefault(group, {})[f"{name}.lora_A.{adapter}"] = layer.weight
        for adapter, layer in module.lora_B.items():
            found.setdefault(group, {})[f"{name}.lora_B.{adapter}"] = layer.weight
    return found


def adopt_routed_lora(module, kernels: Kernels | None = None):
    """Let "moe_lora" run the routed-expert LoRA that peft attached to `module` (a model or a bare MoE block), every
    experts module of it with the same Kernels (`moe_lora.kernels_of(module)`: the path, in-place accumulation)."""
    register()
    for wrapper in _experts_wrappers(module):
        RoutedExpertsLora.adopt(wrapper)
    kernels = kernels or Kernels()
    for _, experts in routed_experts_modules(module):
        if experts.config._experts_implementation != IMPLEMENTATION_NAME:
            experts.config._experts_implementation = IMPLEMENTATION_NAME
        set_kernels(experts, kernels)
    return module


def inject_routed_lora(module, r=32, alpha=64):
    """peft's plain routed-expert LoRA (ParamWrapper, which folds W + BA) on any module: the benchmark's baseline."""
    return inject_adapter_in_model(lora_config(r, alpha), module)


@torch.no_grad()
def randomize_routed_lora_b(model, std=0.02, generator=None):
    """Give every routed-expert lora_B random values (tests and benchmarks: B starts at zero)."""
    for _, _, wrapper in routed_lora_wrappers(model):
        for layer in wrapper.lora_B.values():
            noise = torch.randn(layer.weight.shape, generator=generator, dtype=torch.float32) * std
            layer.weight.copy_(noise.to(layer.weight.device, layer.weight.dtype))
