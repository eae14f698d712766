"""The model's RMSNorm layers on the fused Triton kernels (training/kernels/rmsnorm.py), where they apply.

Only the norm classes known to compute `weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)` are switched
(a variant such as Gemma's `(1 + weight)` is not this), by swapping each instance's class for a subclass whose
forward runs the kernels on a GPU with a frozen weight and the class's own forward otherwise. Parameters, buffers
and state-dict keys are untouched.
"""

STANDARD_RMSNORMS = ("Qwen3MoeRMSNorm", "Qwen2MoeRMSNorm", "Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm")
_fused_classes = {}


def _fused_class(cls):
    if cls not in _fused_classes:
        def forward(self, hidden_states):
            if hidden_states.is_cuda and not self.weight.requires_grad:
                from training.kernels.rmsnorm import rms_norm

                return rms_norm(hidden_states, self.weight, self.variance_epsilon)
            return cls.forward(self, hidden_states)

        _fused_classes[cls] = type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _fused_classes[cls]


def use_fused_rms_norms(model):
    """Switch every standard RMSNorm in the model to the fused kernels; returns how many were switched."""
    switched = 0
    for module in model.modules():
        cls = type(module)
        if cls.__name__ in STANDARD_RMSNORMS and hasattr(module, "variance_epsilon"):
            module.__class__ = _fused_class(cls)
            switched += 1
    return switched
