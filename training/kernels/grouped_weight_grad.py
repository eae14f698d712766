"""Grouped weight gradient over rows sorted by expert: out[e] = scale * sum_{j in e} (c[j] p[j])^T q[q_rows[j]], every
expert's LoRA factor gradient in one launch (docs/training.md, "training/kernels/grouped_weight_grad.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import autotune_configs, m_bucket, shared_memory_prune


def _configs():
    return autotune_configs(
        [
            # BLOCK_P (the rank side), BLOCK_Q, BLOCK_K (rows per step), warps, stages
            (32, 128, 64, 4, 4),
            (32, 256, 64, 8, 3),
            (32, 128, 128, 4, 3),
            (64, 128, 64, 4, 4),
        ],
        names=("BLOCK_P", "BLOCK_Q", "BLOCK_K"),
    )


def shared_bytes(config, stages, named_args, kwargs):
    """Shared memory of one program: the p and q row blocks of `stages` steps in flight."""
    block_p, block_q, block_k = config.kwargs["BLOCK_P"], config.kwargs["BLOCK_Q"], config.kwargs["BLOCK_K"]
    p_size, q_size = named_args["p_ptr"].element_size(), named_args["q_ptr"].element_size()
    return stages * block_k * (block_p * p_size + block_q * q_size)


_prune = shared_memory_prune(shared_bytes, "p_ptr")


@triton.autotune(configs=_configs(), key=["P", "Q", "M_BUCKET", "HAS_Q_ROWS", "HAS_ROW_SCALE", "ACCUMULATE"],
                 restore_value=["out_ptr"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _grouped_weight_grad_kernel(
    p_ptr, q_ptr, out_ptr, counts_ptr, q_rows_ptr, row_scale_ptr,
    P, Q, scale, M_BUCKET,
    stride_pm, stride_pp,
    stride_qm, stride_qq,
    stride_oe, stride_op, stride_oq,
    E: tl.constexpr, E_POW2: tl.constexpr, HAS_Q_ROWS: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
    ACCUMULATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_p = tl.cdiv(P, BLOCK_P)
    num_q = tl.cdiv(Q, BLOCK_Q)
    e = pid // (num_p * num_q)
    pid_pq = pid % (num_p * num_q)
    pid_p = pid_pq // num_q
    pid_q = pid_pq % num_q

    experts = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    rows_end_all = tl.cumsum(counts, 0)
    is_e = experts == e
    group_end = tl.sum(tl.where(is_e, rows_end_all, 0), 0)
    group_start = group_end - tl.sum(tl.where(is_e, counts, 0), 0)

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_p = offs_p < P
    mask_q = offs_q < Q
    # out^T tile (Q x P): the long Q side is the MMA's M, the rank-sized P side its N.
    acc = tl.zeros((BLOCK_Q, BLOCK_P), dtype=tl.float32)
    for m0 in range(group_start, group_end, BLOCK_K):
        offs_m = m0 + tl.arange(0, BLOCK_K)
        mask_m = offs_m < group_end
        if HAS_Q_ROWS:
            src_m = tl.load(q_rows_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        else:
            src_m = offs_m.to(tl.int64)
        q_t = tl.load(
            q_ptr + src_m[None, :] * stride_qm + offs_q[:, None] * stride_qq,
            mask=mask_q[:, None] & mask_m[None, :], other=0.0,
        )
        p = tl.load(
            p_ptr + offs_m[:, None].to(tl.int64) * stride_pm + offs_p[None, :] * stride_pp,
            mask=mask_m[:, None] & mask_p[None, :], other=0.0,
        )
        if HAS_ROW_SCALE:
            c = tl.load(row_scale_ptr + offs_m, mask=mask_m, other=0.0).to(tl.float32)
            p = (p.to(tl.float32) * c[:, None]).to(q_t.dtype)
        acc = tl.dot(q_t, p, acc)

    out_ptrs = out_ptr + e.to(tl.int64) * stride_oe + offs_q[:, None] * stride_oq + offs_p[None, :] * stride_op
    mask = mask_q[:, None] & mask_p[None, :]
    acc = acc * scale
    if ACCUMULATE:  # into an existing gradient (the caller's .grad), one read-modify-write
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def grouped_weight_grad(p, q, counts, *, q_rows=None, scale=1.0, row_scale=None, out_dtype=None, out=None):
    """out (E, P, Q) with out[e] = scale * (row_scale * p)[group e]^T @ q[q_rows[group e]]; p: (M, P) sorted;
    q: (T, Q) or (M, Q); row_scale: (M,) or None; out in out_dtype (default p's). With `out` given (any (E, P, Q)
    strides), the result is added into it."""
    num_experts = counts.shape[0]
    m, p_dim = p.shape
    q_dim = q.shape[1]
    accumulate = out is not None
    if out is None:
        out = torch.empty((num_experts, p_dim, q_dim), device=p.device, dtype=out_dtype or p.dtype)

    def grid(meta):
        return (num_experts * triton.cdiv(p_dim, meta["BLOCK_P"]) * triton.cdiv(q_dim, meta["BLOCK_Q"]),)

    _grouped_weight_grad_kernel[grid](
        p, q, out, counts, q_rows if q_rows is not None else counts, row_scale if row_scale is not None else counts,
        p_dim, q_dim, float(scale), m_bucket(m),
        p.stride(0), p.stride(1),
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        E=num_experts, E_POW2=triton.next_power_of_2(num_experts), HAS_Q_ROWS=q_rows is not None,
        HAS_ROW_SCALE=row_scale is not None, ACCUMULATE=accumulate,
    )
    return out
