"""The plain per-expert loop with torch autograd: what the grouped backends are checked against (tests, benchmark)."""

import torch
import torch.nn.functional as F


def reference_moe_lora(x, top_k_index, top_k_weights, w1, w2, lora1=None, lora2=None):
    """out (T, H) = sum_k weight * expert(x); expert = down(silu(gate) * up), each projection x W^T + s (x A^T) B^T.

    lora1 / lora2: (A (E, r, in), B (E, out, r), scaling) or None. Autograd gives every gradient."""
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        token, choice = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        xe = x[token]
        gate_up = xe @ w1[e].T
        if lora1 is not None:
            a, b, s = lora1
            gate_up = gate_up + s * (xe @ a[e].T) @ b[e].T
        gate, up = gate_up.chunk(2, dim=-1)
        h = F.silu(gate) * up
        down = h @ w2[e].T
        if lora2 is not None:
            a, b, s = lora2
            down = down + s * (h @ a[e].T) @ b[e].T
        out = out.index_add(0, token, down * top_k_weights[token, choice].unsqueeze(-1).to(down.dtype))
    return out
