"""The three ways to run the experts' grouped matmuls (our Triton kernels, `torch._grouped_mm`, a per-expert loop), each
offering the same operations (docs/training.md, "training/grouped_ops.py")."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Groups:
    """Rows sorted by expert: counts (E,) int32 on the device, ends = cumsum(counts) as int32."""

    counts: torch.Tensor
    ends: torch.Tensor
    _host_counts: list | None = None

    @property
    def host_counts(self):
        if self._host_counts is None:
            self._host_counts = self.counts.tolist()
        return self._host_counts


def experts_a(weight_a, num_experts):
    """peft's LoRA A matrix (r * E, in), rows grouped by expert, as (E, r, in): a view, no copy."""
    return weight_a.view(num_experts, -1, weight_a.shape[-1])


def experts_b(weight_b, num_experts):
    """peft's LoRA B matrix (out, r * E), columns rank-major and expert-minor, as an (E, out, r) view."""
    return weight_b.view(weight_b.shape[0], -1, num_experts).permute(2, 0, 1)


def swiglu(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def accumulation_dtype(dtype):
    """fp32 for half types, the type itself for float32 and float64 (gradcheck runs in float64)."""
    return torch.promote_types(dtype, torch.float32)


def swiglu_backward(gate_up, g, row_weight):
    """From G (the down projection's input gradient before the routing weight) and the routing weight of each row:
    (d gate_up, d routing weight) with dh = w * G and dw = <G, h>."""
    acc = accumulation_dtype(gate_up.dtype)
    gate, up = gate_up.to(acc).chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    g = g.to(acc)
    grad_row_weight = (g * gate * sig * up).sum(-1)
    grad_h = g * row_weight.to(acc).unsqueeze(-1)
    grad_gate = grad_h * up * sig * (1 + gate * (1 - sig))
    grad_up = grad_h * gate * sig
    return torch.cat([grad_gate, grad_up], dim=-1).to(gate_up.dtype), grad_row_weight


def _into(out, grad):
    """grad, or out += grad when an accumulation target is given."""
    return grad if out is None else out.add_(grad.to(out.dtype))


def _torch_combine(src, slots, weights):
    picked = src[slots]  # (T, K, H)
    if weights is not None:
        picked = picked * weights.unsqueeze(-1).to(src.dtype)
    return picked.sum(dim=1, dtype=accumulation_dtype(src.dtype)).to(src.dtype)


class LoopOps:
    """One matmul per expert: the reference, and the fallback where no GPU is there."""

    name = "loop"

    def mm(self, x, w, groups, rows=None, lora=None, z=None):
        m = rows.shape[0] if rows is not None else x.shape[0]
        y = x.new_empty((m, w.shape[1]))
        if lora is not None and z is None:
            z, _ = self.mm(x, lora[0].to(x.dtype), groups, rows=rows)
        start = 0
        for e, count in enumerate(groups.host_counts):
            end = start + count
            if count:
                xe = x[rows[start:end]] if rows is not None else x[start:end]
                ye = xe @ w[e].T
                if lora is not None:
                    ye = ye + lora[2] * (z[start:end] @ lora[1][e].to(x.dtype).T)
                y[start:end] = ye
            start = end
        return y, z if lora is not None else None

    def weight_grad(self, p, q, groups, q_rows=None, scale=1.0, row_scale=None, out_dtype=None, out=None):
        if row_scale is not None:
            p = (p.to(accumulation_dtype(p.dtype)) * row_scale.unsqueeze(-1)).to(p.dtype)
        grad = p.new_zeros((groups.counts.shape[0], p.shape[1], q.shape[1]))
        start = 0
        for e, count in enumerate(groups.host_counts):
            end = start + count
            if count:
                qe = q[q_rows[start:end]] if q_rows is not None else q[start:end]
                grad[e] = scale * (p[start:end].T @ qe)
            start = end
        return _into(out, grad.to(out_dtype or p.dtype))

    def peft_b_to_experts(self, weight_b, num_experts, dtype):
        return experts_b(weight_b, num_experts).transpose(1, 2).to(dtype).contiguous()

    def experts_to_peft_b(self, b, dtype, out=None):
        return _into(out, b.permute(2, 1, 0).reshape(b.shape[2], -1).to(dtype))

    def combine(self, src, slots, weights=None):
        return _torch_combine(src, slots, weights)

    def mm_combine(self, x, w, groups, tokens, slots, order, weights=None, lora=None, z=None):
        """combine(mm(x, w, groups, lora=lora, z=z), slots, weights): a grouped product of sorted rows (never
        gathered) summed into its tokens; tokens and order are each sorted row's token and (token, choice) pair."""
        y, _ = self.mm(x, w, groups, lora=lora, z=z)
        return self.combine(y, slots, weights)

    def mm_swiglu(self, x, w, groups, rows=None, lora=None, a=None):
        """(gate_up, z, h, z2): mm(x, w, groups, rows, lora) and then swiglu(gate_up, groups, a), the gate/up
        projection and its activation."""
        gate_up, z = self.mm(x, w, groups, rows=rows, lora=lora)
        h, z2 = self.swiglu(gate_up, groups, a)
        return gate_up, z, h, z2

    def swiglu(self, gate_up, groups, a=None):
        h = swiglu(gate_up)
        return h, (self.mm(h, a.to(h.dtype), groups)[0] if a is not None else None)

    def swiglu_backward(self, gate_up, g, weights, order, groups, b=None, h=None):
        row_weight = weights.reshape(-1)[order].to(accumulation_dtype(gate_up.dtype))
        grad_gate_up, grad_row_weight = swiglu_backward(gate_up, g, row_weight)
        if h is not None:
            h.copy_(swiglu(gate_up))
        grad_weights = torch.empty_like(grad_row_weight)
        grad_weights[order] = grad_row_weight
        u = self.mm(grad_gate_up, b.to(gate_up.dtype), groups)[0] if b is not None else None
        return grad_gate_up, grad_weights.view_as(weights).to(weights.dtype), row_weight, u


class GroupedMmOps(LoopOps):
    """`torch._grouped_mm` (CUTLASS on sm_90 / sm_100): bf16 only, gathers materialised by PyTorch."""

    name = "grouped_mm"

    def mm(self, x, w, groups, rows=None, lora=None, z=None):
        xs = x[rows] if rows is not None else x
        y = torch._grouped_mm(xs, w.transpose(1, 2), offs=groups.ends)
        if lora is None:
            return y, None
        l1, l2, scale = lora
        if z is None:
            z = torch._grouped_mm(xs, l1.to(x.dtype).transpose(1, 2), offs=groups.ends)
        y = y.add_(torch._grouped_mm(z, l2.to(x.dtype).transpose(1, 2), offs=groups.ends), alpha=scale)
        return y, z

    def weight_grad(self, p, q, groups, q_rows=None, scale=1.0, row_scale=None, out_dtype=None, out=None):
        if row_scale is not None:
            p = (p.float() * row_scale.unsqueeze(-1)).to(p.dtype)
        qs = q[q_rows] if q_rows is not None else q
        grad = torch._grouped_mm(p.t(), qs, offs=groups.ends)
        # An expert with no rows must get a zero gradient, whatever the kernel leaves there.
        grad = grad.masked_fill_((groups.counts == 0).view(-1, 1, 1), 0.0)
        grad = grad.mul_(scale) if scale != 1.0 else grad
        return _into(out, grad.to(out_dtype or p.dtype))


class TritonOps(LoopOps):
    """The project's Triton kernels: gather and LoRA fused into the matmul, fused SwiGLU, combine and relayout."""

    name = "triton"

    def mm(self, x, w, groups, rows=None, lora=None, z=None):
        from training.kernels.grouped_gemm import grouped_gemm

        return grouped_gemm(x, w, groups.counts, rows=rows, lora=lora, z=z)

    def weight_grad(self, p, q, groups, q_rows=None, scale=1.0, row_scale=None, out_dtype=None, out=None):
        from training.kernels.grouped_weight_grad import grouped_weight_grad

        return grouped_weight_grad(p, q, groups.counts, q_rows=q_rows, scale=scale, row_scale=row_scale,
                                   out_dtype=out_dtype, out=out)

    def peft_b_to_experts(self, weight_b, num_experts, dtype):
        from training.kernels.relayout import peft_b_to_experts

        return peft_b_to_experts(weight_b, num_experts, dtype)

    def experts_to_peft_b(self, experts_b, dtype, out=None):
        from training.kernels.relayout import experts_to_peft_b

        return experts_to_peft_b(experts_b, dtype, out=out)

    def combine(self, src, slots, weights=None):
        from training.kernels.combine import combine

        return combine(src, slots, weights)

    def swiglu(self, gate_up, groups, a=None):
        from training.kernels.swiglu import swiglu

        return swiglu(gate_up, groups.counts, a)

    def swiglu_backward(self, gate_up, g, weights, order, groups, b=None, h=None):
        from training.kernels.swiglu import swiglu_backward

        return swiglu_backward(gate_up, g, weights, order, groups.counts, b, h)


class TritonScatterOps(TritonOps):
    """Our Triton kernels with each combine done in the epilogue of the grouped product before it: its rows are added
    into their tokens' float32 rows (atomic adds) and never stored (docs/training.md, "triton_scatter")."""

    name = "triton_scatter"

    def mm_combine(self, x, w, groups, tokens, slots, order, weights=None, lora=None, z=None):
        from training.kernels.grouped_gemm import grouped_gemm

        out = torch.zeros((slots.shape[0], w.shape[1]), device=x.device, dtype=torch.float32)
        flat = weights.reshape(-1) if weights is not None else None
        grouped_gemm(x, w, groups.counts, lora=lora, z=z, scatter=(tokens, order, flat, out))
        return out.to(x.dtype)


class TritonFusedOps(TritonScatterOps):
    """triton_scatter, and the activation (with its LoRA product) in the gate/up product's epilogue where the TMA
    kernel reads the weights (docs/training.md, "triton_fused")."""

    name = "triton_fused"

    def mm_swiglu(self, x, w, groups, rows=None, lora=None, a=None):
        from training.kernels.grouped_gemm import gated_grouped_gemm

        fused = gated_grouped_gemm(x, w, groups.counts, rows=rows, lora=lora, a2=a)
        return fused if fused is not None else super().mm_swiglu(x, w, groups, rows=rows, lora=lora, a=a)


BACKENDS = {ops.name: ops for ops in (LoopOps(), GroupedMmOps(), TritonOps(), TritonScatterOps(), TritonFusedOps())}
