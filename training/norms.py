"""The model's RMSNorm layers on the fused Triton kernels (training/kernels/rmsnorm.py), where they apply.

Only the norm classes known to compute `weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)` are switched
(a variant such as Gemma's `(1 + weight)` is not this), by swapping each instance's class for a subclass whose
forward runs the kernels on a GPU with a frozen weight and the class's own forward otherwise
(training/class_switch.py). Parameters, buffers and state-dict keys are untouched.
"""

from training.class_switch import switch_class

STANDARD_RMSNORMS = ("Qwen3MoeRMSNorm", "Qwen2MoeRMSNorm", "Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm")


def _fused_forward(self, hidden_states):
    from training.kernels.rmsnorm import rms_norm

    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _applies(self, hidden_states):
    return hidden_states.is_cuda and not self.weight.requires_grad


def use_fused_rms_norms(model):
    """Switch every standard RMSNorm in the model to the fused kernels; returns how many were switched."""
    switched = 0
    for module in model.modules():
        if type(module).__name__ in STANDARD_RMSNORMS and hasattr(module, "variance_epsilon"):
            switch_class(module, _fused_forward, _applies)
            switched += 1
    return switched
