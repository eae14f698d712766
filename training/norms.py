"""The model's RMSNorm layers on the fused Triton kernels (training/kernels/rmsnorm.py), where they apply.

Only the norm classes known to compute `weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)` are switched
(a variant such as Gemma's `(1 + weight)` is not this), by swapping each instance's class for a subclass whose
forward runs the kernels on a GPU with a frozen weight and the class's own forward otherwise
(training/class_switch.py). Parameters, buffers and state-dict keys are untouched.

The decoder layer's two norms before attention and before the MLP hand their output to modules that keep it for
their own backward (the q/k/v projections' LoRA, the router and experts), so these norms' backward works from that
output (`keep_output`, training/kernels/rmsnorm.py) and keeps nothing else: two activations a layer fewer. A norm
whose weight has a zero (its output then says nothing of that column) keeps its input as before.
"""

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
