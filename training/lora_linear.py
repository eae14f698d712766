"""peft's LoRA Linear (attention q/k/v/o) with one fused autograd function instead of peft's chain of ops
(docs/training.md, "training/lora_linear.py")."""

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear


class _LoraLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scale):
        x2 = x.reshape(-1, x.shape[-1])
        a, b = lora_a.to(x.dtype), lora_b.to(x.dtype)
        xa = x2 @ a.t()
        y = F.linear(x2, weight, bias)
        y.addmm_(xa, b.t(), alpha=scale)
        ctx.save_for_backward(x2, weight, a, b, xa)
        ctx.scale, ctx.factor_dtypes = scale, (lora_a.dtype, lora_b.dtype)
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad_y):
        x2, weight, a, b, xa = ctx.saved_tensors
        scale = ctx.scale
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(x2.dtype)
        dyb = dy @ b  # (N, r)
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (dy @ weight).addmm_(dyb, a, alpha=scale).view(*grad_y.shape[:-1], x2.shape[-1])
        if ctx.needs_input_grad[3]:
            grad_a = (dyb.t() @ x2).to(ctx.factor_dtypes[0]).mul_(scale)
        if ctx.needs_input_grad[4]:
            grad_b = (dy.t() @ xa).to(ctx.factor_dtypes[1]).mul_(scale)
        return grad_x, None, None, grad_a, grad_b, None


class LoraLinear(Linear):
    """peft's lora.Linear, forward fused where it can be (see the module docstring)."""

    @classmethod
    def adopt(cls, layer):
        if type(layer) is Linear:
            layer.__class__ = cls
        return layer

    def _fused_adapter(self):
        """(A weight, B weight, scaling) when the fused path computes exactly what peft would, else None."""
        base = self.base_layer
        if self.disable_adapters or self.merged or type(base) is not torch.nn.Linear:
            return None
        if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
            return None  # a trained base: its gradient is peft's (and autograd's) business
        active = [name for name in self.active_adapters if name in self.lora_A]
        if len(active) != 1:
            return None
        name = active[0]
        if (name in getattr(self, "lora_variant", {}) or self.use_dora.get(name)
                or not isinstance(self.lora_dropout[name], torch.nn.Identity)
                or self.lora_B[name].bias is not None):
            return None
        return self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name]

    def forward(self, x, *args, **kwargs):
        fused = None if args or kwargs else self._fused_adapter()
        if fused is None:
            return super().forward(x, *args, **kwargs)
        lora_a, lora_b, scale = fused
        base = self.base_layer
        return _LoraLinearFunction.apply(x, base.weight, base.bias, lora_a, lora_b, scale)
