"""The model's top-k softmax routers on the fused Triton kernels (training/kernels/router.py), where they apply.

Only the router classes whose forward is `logits = linear(x, weight)`, softmax in fp32, top-k, the chosen
probabilities renormalised (per `norm_topk_prob`, or always) and cast back to the logits' type are switched, by
swapping each instance's class for a subclass (as training/norms.py does for RMSNorm). The linear layer stays
torch's, and the logits are returned as before (an auxiliary balancing loss still sees them); only what follows
them runs in one kernel each way, on a GPU. Parameters, buffers and state-dict keys are untouched.
"""

import torch
import torch.nn.functional as F

# class name -> normalise the chosen probabilities: None reads the instance's `norm_topk_prob`.
TOP_K_SOFTMAX_ROUTERS = {
    "Qwen3MoeTopKRouter": None,
    "Qwen2MoeTopKRouter": None,
    "Qwen3NextTopKRouter": None,
    "OlmoeTopKRouter": None,
    "Qwen3_5MoeTopKRouter": True,
}
_fused_classes = {}


class TopKSoftmax(torch.autograd.Function):
    """logits (T, E) -> (routing weights (T, K) in the logits' type, experts (T, K) int64)."""

    @staticmethod
    def forward(ctx, logits, top_k, normalize):
        from training.kernels.router import route_top_k

        weights, index = route_top_k(logits, top_k, normalize)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(logits, index)
        ctx.normalize = normalize
        return weights, index

    @staticmethod
    def backward(ctx, grad_weights, _grad_index):
        from training.kernels.router import route_top_k_backward

        logits, index = ctx.saved_tensors
        return route_top_k_backward(logits, index, grad_weights, ctx.normalize), None, None


def _fused_class(cls, normalize):
    if cls not in _fused_classes:
        def forward(self, hidden_states):
            if not hidden_states.is_cuda:
                return cls.forward(self, hidden_states)
            logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
            norm = self.norm_topk_prob if normalize is None else normalize
            weights, index = TopKSoftmax.apply(logits, self.top_k, bool(norm))
            return logits, weights, index

        _fused_classes[cls] = type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})
    return _fused_classes[cls]


def use_fused_routers(model):
    """Switch every known top-k softmax router in the model to the fused kernels; returns how many were switched."""
    switched = 0
    for module in model.modules():
        cls = type(module)
        known = cls.__name__ in TOP_K_SOFTMAX_ROUTERS
        if known and all(hasattr(module, name) for name in ("top_k", "hidden_dim", "weight")):
            module.__class__ = _fused_class(cls, TOP_K_SOFTMAX_ROUTERS[cls.__name__])
            switched += 1
    return switched
