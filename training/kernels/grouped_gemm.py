"""Grouped GEMM over rows sorted by expert: y[j] = x[rows[j]] @ W[e(j)]^T (+ s * (x[rows[j]] @ L1[e]^T) @ L2[e]^T).

`w` is any (E, N, K) view, so one kernel serves both expert layouts and both directions: the forward passes
`gate_up_proj` (E, 2I, H) or `down_proj` (E, H, I) as they are, the input gradient passes them transposed.
With LoRA, the rank-wide product z = x L1^T runs first as its own narrow grouped GEMM (the backward needs z for the
factor gradients), then z L2^T is added into the base product's fp32 accumulator after its K loop, so W + BA never
exists. L1 and L2 may be float32 (peft keeps adapters in float32): they are cast to x's type as they are loaded.
(Accumulating z inside the base K loop instead, which saves a launch and a second read of x, measured slower on an
H200: 2.12 vs 1.84 ms for the four GEMMs of a 30B-shaped block at 4096 tokens, bench/NOTES_moe_block.md.)
`rows` gathers the input rows inside the kernel (the token -> sorted-slot gather of the first MoE GEMM).

Tiles are found without a host sync: every program reads the per-expert row counts and locates its own
(expert, row block) from the cumulative block counts, so empty and uneven groups cost nothing.
"""

import torch
import triton
import triton.language as tl

from training.kernels._config import autotune_configs, m_bucket


def _configs():
    return autotune_configs(
        [
            # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
            (128, 128, 64, 8, 4),
            (128, 256, 64, 8, 3),
            (64, 128, 64, 4, 4),
            (128, 128, 128, 8, 3),
            (64, 256, 64, 8, 4),
            # narrow outputs: x @ A^T and dy @ B (N = the LoRA rank)
            (128, 32, 128, 4, 4),
            (64, 32, 128, 4, 4),
            (128, 64, 64, 4, 4),
        ],
        names=("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    )


@triton.autotune(configs=_configs(), key=["N", "K", "R", "M_BUCKET", "HAS_ROWS"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _grouped_gemm_kernel(
    x_ptr, w_ptr, y_ptr, counts_ptr, rows_ptr, z_ptr, l2_ptr,
    M, N, K, R, lora_scale, M_BUCKET,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_ym, stride_yn,
    stride_zm, stride_zr,
    stride_l2e, stride_l2n, stride_l2r,
    E: tl.constexpr, E_POW2: tl.constexpr,
    HAS_ROWS: tl.constexpr, HAS_LORA: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    # n fastest: the programs of one row block run together and share its x tile in L2.
    tile_m = pid // num_n
    pid_n = pid % num_n

    experts = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    blocks_end = tl.cumsum(blocks, 0)
    e = tl.sum((blocks_end <= tile_m).to(tl.int32), 0)
    if e >= E:
        return
    rows_end_all = tl.cumsum(counts, 0)
    is_e = experts == e
    group_end = tl.sum(tl.where(is_e, rows_end_all, 0), 0)
    group_start = group_end - tl.sum(tl.where(is_e, counts, 0), 0)
    first_block = tl.sum(tl.where(is_e, blocks_end - blocks, 0), 0)
    row_start = group_start + (tile_m - first_block) * BLOCK_M

    offs_m = row_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < group_end
    if HAS_ROWS:
        src_m = tl.load(rows_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    else:
        src_m = offs_m.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + src_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_base = w_ptr + e.to(tl.int64) * stride_we
    w_ptrs = w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:  # no K tail: only the row and column masks (the common case: K is 2048, 1536, 768, ...)
            a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=mask_n[None, :], other=0.0).to(a.dtype)
        else:
            mask_k = offs_k < K - k0
            a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(a.dtype)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    if HAS_LORA:
        offs_r = tl.arange(0, BLOCK_R)
        mask_r = offs_r < R
        z = tl.load(
            z_ptr + offs_m[:, None].to(tl.int64) * stride_zm + offs_r[None, :] * stride_zr,
            mask=mask_m[:, None] & mask_r[None, :], other=0.0,
        )
        l2 = tl.load(
            l2_ptr + e.to(tl.int64) * stride_l2e + offs_n[None, :] * stride_l2n + offs_r[:, None] * stride_l2r,
            mask=mask_r[:, None] & mask_n[None, :], other=0.0,
        ).to(z.dtype)
        acc += lora_scale * tl.dot(z, l2)

    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def grouped_gemm(x, w, counts, *, rows=None, lora=None):
    """(y (M, N), z (M, R) or None): y[j] = x[rows[j]] @ w[e]^T + s * z[j] @ l2[e]^T with z[j] = x[rows[j]] @ l1[e]^T,
    for the rows j of expert e.

    x: (T, K) or (M, K); w: (E, N, K), any strides; counts: (E,) int32 rows per expert, in sorted order;
    rows: (M,) source row of x for each sorted row (None: x is already sorted);
    lora: None or (l1 (E, R, K), l2 (E, N, R), s), any strides, x's type or float32.
    """
    z = None
    if lora is not None:
        l1, l2, scale = lora
        z, _ = grouped_gemm(x, l1, counts, rows=rows)
    num_experts, n, k = w.shape
    m = rows.shape[0] if rows is not None else x.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return y, z
    r = z.shape[1] if z is not None else 0
    z_arg, l2_arg = (z, l2) if z is not None else (x, w)
    rows_arg = rows if rows is not None else counts

    def grid(meta):
        max_blocks = triton.cdiv(m, meta["BLOCK_M"]) + num_experts
        return (max_blocks * triton.cdiv(n, meta["BLOCK_N"]),)

    _grouped_gemm_kernel[grid](
        x, w, y, counts, rows_arg, z_arg, l2_arg,
        m, n, k, r, float(scale) if z is not None else 0.0, m_bucket(m),
        x.stride(0), x.stride(1),
        w.stride(0), w.stride(1), w.stride(2),
        y.stride(0), y.stride(1),
        z_arg.stride(0), z_arg.stride(1),
        l2_arg.stride(0), l2_arg.stride(1), l2_arg.stride(2),
        E=num_experts, E_POW2=triton.next_power_of_2(num_experts),
        HAS_ROWS=rows is not None, HAS_LORA=z is not None, BLOCK_R=max(16, triton.next_power_of_2(max(r, 1))),
    )
    return y, z
