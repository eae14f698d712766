"""The model's RMSNorm layers on the fused Triton kernels (training/kernels/rmsnorm.py), where they apply
(docs/training.md, "training/norms.py")."""

from training.class_switch import switch_class

STANDARD_RMSNORMS = ("Qwen3MoeRMSNorm", "Qwen2MoeRMSNorm", "Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm")
OUTPUT_KEPT_BY_NEXT = ("input_layernorm", "post_attention_layernorm")  # decoder-layer names, every listed family
KEEP_OUTPUT_ATTRIBUTE = "_rms_norm_keeps_output"


def _fused_forward(self, hidden_states):
    from training.kernels.rmsnorm import rms_norm

    keep_output = self.__dict__.get(KEEP_OUTPUT_ATTRIBUTE, False)
    if keep_output is None:  # a candidate: decided at its first forward, when its weight is surely loaded
        keep_output = self.__dict__[KEEP_OUTPUT_ATTRIBUTE] = bool((self.weight != 0).all())
    return rms_norm(hidden_states, self.weight, self.variance_epsilon, keep_output)


def _applies(self, hidden_states):
    return hidden_states.is_cuda and not self.weight.requires_grad


def use_fused_rms_norms(model):
    """Switch every standard RMSNorm in the model to the fused kernels; returns how many were switched."""
    switched = 0
    for name, module in model.named_modules():
        if type(module).__name__ in STANDARD_RMSNORMS and hasattr(module, "variance_epsilon"):
            switch_class(module, _fused_forward, _applies)
            # None: to be decided from the weight at the first forward (here it may still be on the meta device,
            # or be loaded later); a plain attribute, not in the state dict
            candidate = name.rsplit(".", 1)[-1] in OUTPUT_KEPT_BY_NEXT
            module.__dict__[KEEP_OUTPUT_ATTRIBUTE] = None if candidate else False
            switched += 1
    return switched
