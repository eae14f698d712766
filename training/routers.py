"""The model's top-k softmax routers on the fused Triton kernels (training/kernels/router.py), where they apply
(docs/training.md, "training/routers.py")."""

import torch
import torch.nn.functional as F

from training.class_switch import original_class, switch_class

# class name -> normalise the chosen probabilities: None reads the instance's `norm_topk_prob`.
TOP_K_SOFTMAX_ROUTERS = {
    "Qwen3MoeTopKRouter": None,
    "Qwen2MoeTopKRouter": None,
    "Qwen3NextTopKRouter": None,
    "OlmoeTopKRouter": None,
    "Qwen3_5MoeTopKRouter": True,
}


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


def normalizes(router):
    """Whether this router renormalises its chosen probabilities."""
    normalize = TOP_K_SOFTMAX_ROUTERS[original_class(router).__name__]
    return bool(router.norm_topk_prob if normalize is None else normalize)


def _fused_forward(self, hidden_states):
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    weights, index = TopKSoftmax.apply(logits, self.top_k, normalizes(self))
    return logits, weights, index


def _applies(self, hidden_states):
    return hidden_states.is_cuda


def use_fused_routers(model):
    """Switch every known top-k softmax router in the model to the fused kernels; returns how many were switched."""
    switched = 0
    for module in model.modules():
        known = type(module).__name__ in TOP_K_SOFTMAX_ROUTERS
        if known and all(hasattr(module, name) for name in ("top_k", "hidden_dim", "weight")):
            switch_class(module, _fused_forward, _applies)
            switched += 1
    return switched
