"""The model's RMSNorm layers on the fused Triton kernels (training/kernels/rmsnorm.py, gated_rmsnorm.py), where
they apply (docs/training.md, "training/norms.py")."""

from training.class_switch import switch_class

STANDARD_RMSNORMS = ("Qwen3MoeRMSNorm", "Qwen2MoeRMSNorm", "Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm")
# `(x r) (1 + w)` in float32, rounded once: Qwen3.5/3.6's and Qwen3-Next's
ZERO_CENTERED_RMSNORMS = ("Qwen3_5MoeRMSNorm", "Qwen3_5RMSNorm", "Qwen3NextRMSNorm")
# their Gated DeltaNet layers' `(w round(x r)) silu(gate)`
GATED_RMSNORMS = ("Qwen3_5MoeRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3NextRMSNormGated")
OUTPUT_KEPT_BY_NEXT = ("input_layernorm", "post_attention_layernorm")  # decoder-layer names, every listed family
KEEP_OUTPUT_ATTRIBUTE = "_rms_norm_keeps_output"
KERNEL_DEVICE_TYPES = ("cuda",)  # where the Triton kernels run (Triton's interpreter may play one on the CPU)
ZERO_CENTERED_ATTRIBUTE = "_rms_norm_zero_centered"


def _epsilon(norm):
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def _fused_forward(self, hidden_states):
    from training.kernels.rmsnorm import rms_norm

    zero_centered = self.__dict__.get(ZERO_CENTERED_ATTRIBUTE, False)
    keep_output = self.__dict__.get(KEEP_OUTPUT_ATTRIBUTE, False)
    if keep_output is None:  # a candidate: decided at its first forward, when its weight is surely loaded
        scale = self.weight + 1 if zero_centered else self.weight
        keep_output = self.__dict__[KEEP_OUTPUT_ATTRIBUTE] = bool((scale != 0).all())
    return rms_norm(hidden_states, self.weight, _epsilon(self), keep_output, zero_centered)


def _applies(self, hidden_states):
    return hidden_states.device.type in KERNEL_DEVICE_TYPES and not self.weight.requires_grad


def _gated_forward(self, hidden_states, gate):
    from training.kernels.gated_rmsnorm import gated_rms_norm

    return gated_rms_norm(hidden_states, gate, self.weight, self.variance_epsilon)


def _gated_applies(self, hidden_states, gate=None):
    return hidden_states.device.type in KERNEL_DEVICE_TYPES and not self.weight.requires_grad and gate is not None \
        and hidden_states.shape == gate.shape


def use_fused_rms_norms(model):
    """Switch every RMSNorm of the classes above in the model to the fused kernels; returns how many were
    switched."""
    switched = 0
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in GATED_RMSNORMS and getattr(module, "activation", None) == "silu":
            switch_class(module, _gated_forward, _gated_applies)
            switched += 1
        elif kind in STANDARD_RMSNORMS + ZERO_CENTERED_RMSNORMS and hasattr(module, "weight"):
            switch_class(module, _fused_forward, _applies)
            module.__dict__[ZERO_CENTERED_ATTRIBUTE] = kind in ZERO_CENTERED_RMSNORMS
            # None: to be decided from the weight at the first forward (here it may still be on the meta device,
            # or be loaded later); a plain attribute, not in the state dict
            candidate = name.rsplit(".", 1)[-1] in OUTPUT_KEPT_BY_NEXT
            module.__dict__[KEEP_OUTPUT_ATTRIBUTE] = None if candidate else False
            switched += 1
    return switched
