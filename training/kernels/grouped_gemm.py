"""Grouped GEMM over rows sorted by expert: y[j] = x[rows[j]] @ W[e(j)]^T (+ s * (x[rows[j]] @ L1[e]^T) @ L2[e]^T)
(docs/training.md, "training/kernels/grouped_gemm.py")."""

import os

import torch
import triton
import triton.language as tl

from training.kernels._config import autotune_configs, interpreting, m_bucket, shared_memory_prune

# BLOCK_M, BLOCK_N, BLOCK_K, warps, stages. Chosen on an H200 with bench/moe_gemms.py (bench/NOTES_moe_block.md):
# 128 x 256 tiles won for the four products of a block; the others stay for narrower N and other epilogues.
_TMA = [
    (128, 256, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (64, 256, 64, 8, 4),
]
_WIDE = _TMA + [(128, 128, 128, 8, 3)]  # the pointer kernel's wide products
# Narrow outputs (N = the LoRA rank: x @ A^T, dy @ B): little shared memory per program, so several share an SM
# and keep enough loads in flight.
_NARROW = [
    (128, 32, 128, 4, 4),
    (64, 32, 128, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 32, 64, 4, 3),
    (128, 32, 64, 4, 3),
    (32, 32, 128, 4, 3),
    (64, 32, 128, 4, 2),
]
_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K")


def _configs(shapes, **variants):
    """Configs for these block shapes; each keyword (a constexpr: its values) multiplies them."""
    configs = autotune_configs(shapes, names=_NAMES)
    for name, values in variants.items():
        values = values[:1] if interpreting() else values  # the interpreter runs one config, untimed
        configs = [triton.Config({**c.kwargs, name: v}, num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in configs for v in values]
    return configs


def _by_width(configs, named_args, **_):
    """Tune narrow products (N <= 64) over the narrow configs only, wide ones over the wide configs."""
    narrow = named_args["N"] <= 64
    kept = [c for c in configs if (c.kwargs["BLOCK_N"] <= 64) == narrow]
    return kept or configs


def shared_bytes(config, stages, named_args, kwargs):
    """Shared memory of one program: the pipelined x and w tiles of `stages` K steps, and with LoRA the z and l2
    tiles of the epilogue, in x's type as the kernel casts them (the model of Triton's own matmul pruning, plus the
    epilogue's operands)."""
    block_m, block_n, block_k = (config.kwargs[name] for name in _NAMES)
    size = named_args["x_ptr"].element_size()
    total = stages * (block_m + block_n) * block_k * size
    if kwargs.get("HAS_LORA"):
        total += kwargs["BLOCK_R"] * (block_m + block_n) * size
    return max(total, block_m * block_n * named_args["y_ptr"].element_size())  # the output tile's layout change


_prune_pointer = shared_memory_prune(shared_bytes, "x_ptr", then=_by_width)
_prune_tma = shared_memory_prune(shared_bytes, "x_ptr")


@triton.jit
def _expert_tile(tile_m, experts, counts, blocks, blocks_end, rows_end, BLOCK_M: tl.constexpr):
    """(expert, first row, end of the expert's rows) of row block `tile_m` (the row blocks of all experts in order)."""
    e = tl.sum((blocks_end <= tile_m).to(tl.int32), 0)
    is_e = experts == e
    group_end = tl.sum(tl.where(is_e, rows_end, 0), 0)
    group_start = group_end - tl.sum(tl.where(is_e, counts, 0), 0)
    first_block = tl.sum(tl.where(is_e, blocks_end - blocks, 0), 0)
    return e, group_start + (tile_m - first_block) * BLOCK_M, group_end


@triton.jit
def _rows_of_tile(tile_m, counts_ptr, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, row offsets, row mask) of row block `tile_m`, from the per-expert row counts; expert >= E for a
    block past the last (a program with nothing to do)."""
    experts = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    e, row_start, group_end = _expert_tile(tile_m, experts, counts, blocks, tl.cumsum(blocks, 0),
                                           tl.cumsum(counts, 0), BLOCK_M)
    offs_m = row_start + tl.arange(0, BLOCK_M)
    return e, offs_m, offs_m < group_end


@triton.jit
def _add_lora(
    acc, e, offs_m, mask_m, offs_n, mask_n, z_ptr, l2_ptr, R, lora_scale,
    stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, BLOCK_R: tl.constexpr,
):
    """acc + s * z[rows] @ l2[e]^T."""
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    z = tl.load(
        z_ptr + offs_m[:, None].to(tl.int64) * stride_zm + offs_r[None, :] * stride_zr,
        mask=mask_m[:, None] & mask_r[None, :], other=0.0,
    )
    l2 = tl.load(
        l2_ptr + e.to(tl.int64) * stride_l2e + offs_n[None, :] * stride_l2n + offs_r[:, None] * stride_l2r,
        mask=mask_r[:, None] & mask_n[None, :], other=0.0,
    )
    # Into the same accumulator (no second BLOCK_M x BLOCK_N fp32 tile in registers); s folded into l2 in fp32.
    return tl.dot(z, (l2.to(tl.float32) * lora_scale).to(z.dtype), acc)


@triton.jit
def _store(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, stride_yn):
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _scatter_add(acc, offs_m, mask_m, offs_n, mask_n, out_ptr, stride_om, token_ptr, order_ptr, weight_ptr,
                 HAS_WEIGHT: tl.constexpr):
    """out[token[j]] += weight[order[j]] * acc[j]: the tile's rows added into their tokens' float32 rows (the
    combine of the top-k choices, done where the rows are made)."""
    tokens = tl.load(token_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    if HAS_WEIGHT:
        pairs = tl.load(order_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        acc = acc * tl.load(weight_ptr + pairs, mask=mask_m, other=0.0).to(tl.float32)[:, None]
    _write_quarters(out_ptr + tokens * stride_om, acc, mask_m, offs_n[None, :], _end(offs_n, mask_n), True)


@triton.jit
def _end(offs, mask):
    """One past the last column in range: what a quarter's columns are masked against."""
    return tl.max(tl.where(mask, offs + 1, 0), 0)


@triton.jit
def _halves(tile):
    """The left and right column halves of a (rows, columns) tile."""
    half: tl.constexpr = tile.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(tile, (tile.shape[0], 2, half)), (0, 2, 1)))


@triton.jit
def _write_quarters(rows, tile, mask_m, offs, n_end, ADD: tl.constexpr):
    """rows[:, None] + offs <- tile (stored, or added atomically with ADD), a quarter of the columns at a time: fewer
    64-bit addresses live at once (bench/hopper_compile.py)."""
    left, right = _halves(tile)
    offs_l, offs_r = _halves(offs)
    _write_halves(rows, left, mask_m, offs_l, n_end, ADD)
    _write_halves(rows, right, mask_m, offs_r, n_end, ADD)


@triton.jit
def _write_halves(rows, part, mask_m, offs, n_end, ADD: tl.constexpr):
    left, right = _halves(part)
    offs_l, offs_r = _halves(offs)
    _write(rows[:, None] + offs_l, left, mask_m[:, None] & (offs_l < n_end), ADD)
    _write(rows[:, None] + offs_r, right, mask_m[:, None] & (offs_r < n_end), ADD)


@triton.jit
def _write(ptrs, values, mask, ADD: tl.constexpr):
    if ADD:
        tl.atomic_add(ptrs, values, mask=mask, sem="relaxed")
    else:
        tl.store(ptrs, values, mask=mask)


@triton.jit
def _epilogue(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, stride_yn, token_ptr, order_ptr, weight_ptr,
              SCATTER: tl.constexpr, HAS_WEIGHT: tl.constexpr, QUARTERS: tl.constexpr):
    """The tile added into its tokens' rows (SCATTER), or stored: whole, or a quarter of its columns at a time
    (QUARTERS, contiguous rows only: fewer addresses live at once, tuned like a block size)."""
    if SCATTER:
        _scatter_add(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, token_ptr, order_ptr, weight_ptr,
                     HAS_WEIGHT)
    elif QUARTERS:
        _write_quarters(y_ptr + offs_m.to(tl.int64) * stride_ym, acc.to(y_ptr.dtype.element_ty), mask_m,
                        offs_n[None, :], _end(offs_n, mask_n), False)
    else:
        _store(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, stride_yn)


@triton.jit
def _factor_tile(f_ptr, e, offs_c, limit, R, stride_fe, stride_fr, stride_fc, BLOCK_R: tl.constexpr):
    """factor[e][:, columns]^T as a (columns, rank) tile, zero past `limit` columns or R ranks."""
    offs_r = tl.arange(0, BLOCK_R)
    return tl.load(f_ptr + e.to(tl.int64) * stride_fe + offs_c[:, None] * stride_fc + offs_r[None, :] * stride_fr,
                   mask=(offs_c < limit)[:, None] & (offs_r < R)[None, :], other=0.0)


@triton.jit
def _gated_epilogue(
    acc_gate, acc_up, e, offs_m, mask_m, offs_i, inter, y_ptr, stride_ym, z_ptr, l2_ptr, R, lora_scale,
    stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, h_ptr, stride_hm,
    a2_ptr, z2_ptr, R2, stride_a2e, stride_a2r, stride_a2i, stride_z2m,
    HAS_LORA: tl.constexpr, BLOCK_R: tl.constexpr, HAS_A2: tl.constexpr, BLOCK_R2: tl.constexpr,
):
    """The gate/up tile's epilogue: both halves stored into gate_up (which the backward keeps), the activation
    h = silu(gate) * up made from those stored values (as the activation's backward remakes it) and stored, and
    h @ a2[e]^T over these columns added into the float32 z2 (the down projection's LoRA input)."""
    mask_i = offs_i < inter
    if HAS_LORA:
        acc_gate = _add_lora(acc_gate, e, offs_m, mask_m, offs_i, mask_i, z_ptr, l2_ptr, R, lora_scale,
                             stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, BLOCK_R)
        acc_up = _add_lora(acc_up, e, offs_m, mask_m, inter + offs_i, mask_i, z_ptr, l2_ptr, R, lora_scale,
                           stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, BLOCK_R)
    gate = acc_gate.to(y_ptr.dtype.element_ty)
    up = acc_up.to(y_ptr.dtype.element_ty)
    gate32, up32 = gate.to(tl.float32), up.to(tl.float32)
    h = (gate32 * tl.sigmoid(gate32) * up32).to(h_ptr.dtype.element_ty)
    y_rows = y_ptr + offs_m.to(tl.int64) * stride_ym
    i_end = _end(offs_i, mask_i)
    _write_quarters(y_rows, gate, mask_m, offs_i[None, :], i_end, False)
    _write_quarters(y_rows + inter, up, mask_m, offs_i[None, :], i_end, False)
    _write_quarters(h_ptr + offs_m.to(tl.int64) * stride_hm, h, mask_m, offs_i[None, :], i_end, False)
    if HAS_A2:
        offs_r = tl.arange(0, BLOCK_R2)
        mask_r = offs_r < R2
        a2 = _factor_tile(a2_ptr, e, offs_i, inter, R2, stride_a2e, stride_a2r, stride_a2i, BLOCK_R2)
        part = tl.dot(h, a2.to(h.dtype))
        tl.atomic_add(z2_ptr + offs_m[:, None].to(tl.int64) * stride_z2m + offs_r[None, :], part,
                      mask=mask_m[:, None] & mask_r[None, :], sem="relaxed")


@triton.jit
def _pointer_kernel(
    x_ptr, w_ptr, y_ptr, counts_ptr, rows_ptr, z_ptr, l2_ptr, token_ptr, order_ptr, weight_ptr,
    M, N, K, R, lora_scale, M_BUCKET,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_ym, stride_yn,
    stride_zm, stride_zr,
    stride_l2e, stride_l2n, stride_l2r,
    E: tl.constexpr, E_POW2: tl.constexpr,
    HAS_ROWS: tl.constexpr, HAS_LORA: tl.constexpr, BLOCK_R: tl.constexpr,
    SCATTER: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    # n fastest: the programs of one row block run together and share its x tile in L2.
    pid_n = pid % num_n
    e, offs_m, mask_m = _rows_of_tile(pid // num_n, counts_ptr, E, E_POW2, BLOCK_M)
    if e >= E:
        return
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
        acc = _add_lora(acc, e, offs_m, mask_m, offs_n, mask_n, z_ptr, l2_ptr, R, lora_scale,
                        stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, BLOCK_R)
    _epilogue(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, stride_yn, token_ptr, order_ptr, weight_ptr,
              SCATTER, HAS_WEIGHT, False)


@triton.jit
def _tma_kernel(
    x_ptr, w_ptr, y_ptr, counts_ptr, rows_ptr, z_ptr, l2_ptr, token_ptr, order_ptr, weight_ptr,
    h_ptr, a2_ptr, z2_ptr,
    M, N, K, R, lora_scale, M_BUCKET, R2,
    stride_xm, stride_w,
    stride_ym, stride_zm, stride_zr,
    stride_l2e, stride_l2n, stride_l2r,
    stride_hm, stride_a2e, stride_a2r, stride_a2i, stride_z2m,
    E: tl.constexpr, E_POW2: tl.constexpr,
    HAS_ROWS: tl.constexpr, HAS_LORA: tl.constexpr, W_T: tl.constexpr,
    BLOCK_R: tl.constexpr, SCATTER: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    GATED: tl.constexpr, HAS_A2: tl.constexpr, BLOCK_R2: tl.constexpr, W_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    FLATTEN: tl.constexpr, QUARTERS: tl.constexpr,
):
    """Persistent TMA kernel: each program walks tiles pid, pid + programs, ..., loading the weights through tensor
    descriptors (docs/training.md, "training/kernels/grouped_gemm.py"). GATED: a tile is W_ROWS (= BLOCK_N / 2) gate
    columns and the same up columns, and its epilogue also makes the activation (`_gated_epilogue`)."""
    experts = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    blocks_end = tl.cumsum(blocks, 0)
    rows_end = tl.cumsum(counts, 0)
    num_n = tl.cdiv(N // 2, W_ROWS) if GATED else tl.cdiv(N, BLOCK_N)
    num_tiles = tl.sum(blocks, 0) * num_n
    if W_T:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[E * K, N], strides=[stride_w, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    else:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[E * N, K], strides=[stride_w, 1],
                                           block_shape=[W_ROWS, BLOCK_K])
    if not HAS_ROWS:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    offs_k = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
        tile_m = tile // num_n
        pid_n = tile % num_n
        e, row_start, group_end = _expert_tile(tile_m, experts, counts, blocks, blocks_end, rows_end, BLOCK_M)
        offs_m = row_start + tl.arange(0, BLOCK_M)
        mask_m = offs_m < group_end
        if HAS_ROWS:
            src_m = tl.load(rows_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
            x_ptrs = x_ptr + src_m[:, None] * stride_xm + offs_k[None, :]
        n0 = pid_n * W_ROWS
        acc = tl.zeros((BLOCK_M, W_ROWS), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, W_ROWS), dtype=tl.float32)  # GATED only: the up columns
        for k0 in range(0, K, BLOCK_K):
            if HAS_ROWS:
                if EVEN_K:
                    a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
                else:
                    a = tl.load(x_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < K - k0), other=0.0)
                x_ptrs += BLOCK_K
            else:
                a = x_desc.load([row_start, k0])
            if W_T:
                b = w_desc.load([e * K + k0, n0]).to(a.dtype)
            else:
                b = w_desc.load([e * N + n0, k0]).to(a.dtype).T
            acc = tl.dot(a, b, acc)
            if GATED:
                b_up = w_desc.load([e * N + N // 2 + n0, k0]).to(a.dtype).T
                acc_up = tl.dot(a, b_up, acc_up)
        offs_n = n0 + tl.arange(0, W_ROWS)
        if GATED:
            _gated_epilogue(acc, acc_up, e, offs_m, mask_m, offs_n, N // 2, y_ptr, stride_ym, z_ptr, l2_ptr, R,
                            lora_scale, stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, h_ptr, stride_hm,
                            a2_ptr, z2_ptr, R2, stride_a2e, stride_a2r, stride_a2i, stride_z2m,
                            HAS_LORA, BLOCK_R, HAS_A2, BLOCK_R2)
        else:
            mask_n = offs_n < N
            if HAS_LORA:
                acc = _add_lora(acc, e, offs_m, mask_m, offs_n, mask_n, z_ptr, l2_ptr, R, lora_scale,
                                stride_zm, stride_zr, stride_l2e, stride_l2n, stride_l2r, BLOCK_R)
            _epilogue(acc, offs_m, mask_m, offs_n, mask_n, y_ptr, stride_ym, 1, token_ptr, order_ptr, weight_ptr,
                      SCATTER, HAS_WEIGHT, QUARTERS)


def _tuned(kernel, configs, key, prune, restore=None, **heuristics):
    """The kernel autotuned. A launch that adds into a tensor (a scattering product's output, a gated product's z2)
    names it in `restore`, so that tuning puts it back after each timed run."""
    heuristics = {"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0, **heuristics}
    return triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune},
                           restore_value=restore)(triton.heuristics(heuristics)(kernel))


def _w_rows(args):
    """Rows of w one tile loads a K step: the tile's columns, or half of them twice over (gate and up) when GATED."""
    return args["BLOCK_N"] // 2 if args["GATED"] else args["BLOCK_N"]


_POINTER_KEY = ["N", "K", "R", "M_BUCKET", "HAS_ROWS", "SCATTER"]
_TMA_KEY = ["N", "K", "R", "M_BUCKET", "HAS_ROWS", "W_T", "HAS_LORA", "SCATTER", "GATED", "HAS_A2"]
# QUARTERS: compiled for sm_90a, the quartered store spills 216 bytes a thread where the whole tile's spills 784
# (bench/hopper_compile.py), but tuning both doubled the first step's compiles (the 30B block's tuning alone outran
# 90 s on the H200) for a gain not yet timed: the default path tunes the whole tile's store, as measured;
# bench/moe_gemms.py times the quartered one beside it.
_TMA_CONFIGS = _configs(_TMA, FLATTEN=(True, False), QUARTERS=(False,))
_FUSED_CONFIGS = _configs(_TMA, FLATTEN=(True, False), QUARTERS=(True,))  # their epilogues write by quarters always
_grouped_gemm_kernel = _tuned(_pointer_kernel, _configs(_WIDE + _NARROW), _POINTER_KEY, _prune_pointer)
_grouped_gemm_tma_kernel = _tuned(_tma_kernel, _TMA_CONFIGS, _TMA_KEY, _prune_tma, W_ROWS=_w_rows)
_scatter_kernel = _tuned(_pointer_kernel, _configs(_WIDE), _POINTER_KEY, _prune_pointer, restore=["y_ptr"])
_scatter_tma_kernel = _tuned(_tma_kernel, _FUSED_CONFIGS, _TMA_KEY, _prune_tma, restore=["y_ptr"], W_ROWS=_w_rows)
_gated_tma_kernel = _tuned(_tma_kernel, _FUSED_CONFIGS, _TMA_KEY, _prune_tma, restore=["z2_ptr"], W_ROWS=_w_rows)


# MOE_LORA_TMA=0 keeps every product on the pointer kernel (an escape hatch, and the A/B switch of the benchmarks).
TMA_ENABLED = os.environ.get("MOE_LORA_TMA", "1") != "0"
_devices: dict[int | None, tuple[int, int]] = {}


def _device(device):
    """(compute capability major, multiprocessors) of a CUDA device, read once."""
    if device.index not in _devices:
        props = torch.cuda.get_device_properties(device)
        _devices[device.index] = (props.major, props.multi_processor_count)
    return _devices[device.index]


def _tma_layout(x, w):
    """None, or (W_T, the weights' row stride) where the TMA kernel can read w (and x, when it needs no gather)."""
    if not TMA_ENABLED or (x.device.type != "cuda" and not interpreting()):
        return None
    if x.device.type == "cuda" and _device(x.device)[0] < 9:
        return None
    size = x.element_size()
    if x.device.type == "cuda" and size != 2:
        # Tuned and checked on the device for bf16/fp16 only; a float32 model (a tiny recipe) hit an illegal memory
        # access here while Triton 3.6 autotuned on an H200, so float32 stays on the pointer kernel.
        return None

    def aligned(*values):
        return all((v * size) % 16 == 0 for v in values)

    if x.stride(1) != 1 or not aligned(x.stride(0)) or x.data_ptr() % 16 or w.data_ptr() % 16:
        return None
    if w.element_size() != size:
        return None
    num_experts, n, k = w.shape
    if w.stride(2) == 1 and w.stride(0) == n * w.stride(1) and aligned(w.stride(1)):
        return False, w.stride(1)
    if w.stride(1) == 1 and w.stride(0) == k * w.stride(2) and aligned(w.stride(2)):
        return True, w.stride(2)
    return None


def _layout(x, w, tma):
    """The TMA layout to launch with, or None for the pointer kernel; tma True insists, False refuses."""
    layout = _tma_layout(x, w) if tma is not False else None
    if tma and layout is None:
        raise ValueError("these tensors cannot be read through TMA descriptors")
    return layout


def _scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def _ensure_allocator():
    """Device-side tensor descriptors need a little global scratch per launch, taken from torch's allocator. Triton
    keeps the allocator in a context variable, which a new thread (autograd's backward) does not inherit: set it for
    every launch."""
    triton.set_allocator(_scratch)


def grouped_gemm(x, w, counts, *, rows=None, lora=None, z=None, tma=None, scatter=None):
    """(y (M, N), z (M, R) or None): y[j] = x[rows[j]] @ w[e]^T + s * z[j] @ l2[e]^T, z[j] = x[rows[j]] @ l1[e]^T, for
    the rows j of expert e; with `scatter` y is added into its tokens' rows instead and not returned (arguments:
    docs/training.md, "grouped_gemm")."""
    if lora is None or z is None:
        z = _narrow(x, counts, rows, lora)
    return _launch(x, w, counts, rows, lora, z, _layout(x, w, tma), scatter), z


def _narrow(x, counts, rows, lora):
    """z = x[rows] @ l1[e]^T, the rank-wide product (None without LoRA)."""
    if lora is None:
        return None
    return _launch(x, lora[0], counts, rows, None, None, None)


def gated_grouped_gemm(x, w, counts, *, rows=None, lora=None, a2=None):
    """The gate/up product with the activation in its epilogue: (gate_up (M, 2I), z (M, R) or None, h (M, I),
    z2 (M, R2) or None) with h = silu(gate) * up and z2[j] = h[j] @ a2[e]^T; None where the TMA kernel cannot read
    w as (E, 2I, K) rows (the caller then runs the product and the activation apart)."""
    layout = _layout(x, w, None)
    if layout is None or layout[0] or w.shape[1] % 2:
        return None
    z = _narrow(x, counts, rows, lora)
    m = rows.shape[0] if rows is not None else x.shape[0]
    h = torch.empty((m, w.shape[1] // 2), device=x.device, dtype=x.dtype)
    z2 = torch.zeros((m, a2.shape[1]), device=x.device, dtype=torch.float32) if a2 is not None else None
    gate_up = _launch(x, w, counts, rows, lora, z, layout, gated=(h, a2, z2))
    return gate_up, z, h, z2.to(x.dtype) if z2 is not None else None


def _scatter_args(scatter, m, n):
    """(out, tokens, order, weights) of a scattering launch, checked: out float32 (T, N), contiguous rows."""
    tokens, order, weights, out = scatter
    if out.dtype != torch.float32 or out.dim() != 2 or out.shape[1] != n or out.stride(1) != 1:
        raise ValueError(f"scatter needs a float32 (tokens, {n}) output with contiguous rows")
    if tokens.shape[0] != m or (weights is not None and order.shape[0] != m):
        raise ValueError(f"scatter needs a token (and with weights a pair) for each of the {m} rows")
    return out, tokens, order, weights


def _launch(x, w, counts, rows, lora, z, layout, scatter=None, gated=None):
    """y, on the TMA kernel with a layout (`_layout`), else on the pointer kernel; with `scatter` (tokens, order,
    weights or None, out): out[tokens[j]] += weights[order[j]] * y[j] (atomic float32 adds), returning None; with
    `gated` (h, a2 or None, z2 or None; TMA only) the activation and z2 += h @ a2[e]^T as well."""
    num_experts, n, k = w.shape
    m = rows.shape[0] if rows is not None else x.shape[0]
    if scatter is not None:
        y, tokens, order, weights = _scatter_args(scatter, m, n)
    else:
        y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return None if scatter is not None else y
    r = z.shape[1] if z is not None else 0
    z_arg, l2_arg = (z, lora[1]) if z is not None else (x, w)
    rows_arg = rows if rows is not None else counts
    scatter_args = (tokens, order if weights is not None else tokens, weights if weights is not None else tokens) \
        if scatter is not None else (counts, counts, counts)
    common = dict(E=num_experts, E_POW2=triton.next_power_of_2(num_experts), HAS_ROWS=rows is not None,
                  HAS_LORA=z is not None, BLOCK_R=max(16, triton.next_power_of_2(max(r, 1))),
                  SCATTER=scatter is not None, HAS_WEIGHT=scatter is not None and weights is not None)
    scale = float(lora[2]) if z is not None else 0.0

    def max_tiles(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) + num_experts) * triton.cdiv(n, meta["BLOCK_N"])

    if layout is not None:
        _ensure_allocator()
        w_t, stride_w = layout
        programs = _device(x.device)[1] if x.device.type == "cuda" else 4
        kernel = _scatter_tma_kernel if scatter is not None else _gated_tma_kernel if gated is not None \
            else _grouped_gemm_tma_kernel
        h, a2, z2 = gated if gated is not None else (y, None, None)
        a2_arg, z2_arg = (a2, z2) if a2 is not None else (w, y)
        r2 = a2.shape[1] if a2 is not None else 0
        kernel[lambda meta: (min(programs, max_tiles(meta)),)](
            x, w, y, counts, rows_arg, z_arg, l2_arg, *scatter_args, h, a2_arg, z2_arg,
            m, n, k, r, scale, m_bucket(m), r2,
            x.stride(0), stride_w,
            y.stride(0), z_arg.stride(0), z_arg.stride(1),
            l2_arg.stride(0), l2_arg.stride(1), l2_arg.stride(2),
            h.stride(0), a2_arg.stride(0), a2_arg.stride(1), a2_arg.stride(2), z2_arg.stride(0),
            W_T=w_t, GATED=gated is not None, HAS_A2=a2 is not None,
            BLOCK_R2=max(16, triton.next_power_of_2(max(r2, 1))), **common,
        )
    else:
        kernel = _scatter_kernel if scatter is not None else _grouped_gemm_kernel
        kernel[lambda meta: (max_tiles(meta),)](
            x, w, y, counts, rows_arg, z_arg, l2_arg, *scatter_args,
            m, n, k, r, scale, m_bucket(m),
            x.stride(0), x.stride(1),
            w.stride(0), w.stride(1), w.stride(2),
            y.stride(0), y.stride(1),
            z_arg.stride(0), z_arg.stride(1),
            l2_arg.stride(0), l2_arg.stride(1), l2_arg.stride(2),
            **common,
        )
    return None if scatter is not None else y
