"""AdamW's step with 8-bit moments in one pass over memory: each moment one companded byte per element with a
float32 scale per block of 256, decoded, updated, applied and encoded again by one Triton program per few blocks; a
bf16 parameter is rounded stochastically. `encode` and `decode` are the same codes in torch (docs/training.md,
"training/kernels/adamw8bit.py")."""

import torch
import triton
import triton.language as tl

from training.kernels._config import interpreting

QBLOCK = 256  # elements that share a scale
M_STEPS = 127.0  # the first moment's codes: -127 .. 127
V_STEPS = 255.5  # the second moment's codes: 0 .. 255, read at (code + 0.5) / 255.5


@triton.jit
def _adamw8bit_kernel(p_ptr, g_ptr, m_ptr, v_ptr, ms_ptr, vs_ptr, n, lr, beta1, beta2, eps, decay, bias1,
                      bias2_sqrt, seed, ROWS: tl.constexpr, QBLOCK: tl.constexpr, STOCHASTIC: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = rows[:, None].to(tl.int64) * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    mask = offs < n
    rmask = rows < tl.cdiv(n, QBLOCK)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    cm = tl.load(m_ptr + offs, mask=mask, other=0).to(tl.float32) / 127.0
    cv = (tl.load(v_ptr + offs, mask=mask, other=0).to(tl.float32) + 0.5) / 255.5
    ms = tl.load(ms_ptr + rows, mask=rmask, other=0.0)
    vs = tl.load(vs_ptr + rows, mask=rmask, other=0.0)
    m = cm * tl.abs(cm) * ms[:, None]
    s = cv * cv * vs[:, None]  # sqrt(v)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * s * s + (1.0 - beta2) * g * g
    m = tl.where(mask, m, 0.0)
    s = tl.where(mask, tl.sqrt(v), 0.0)
    new = p.to(tl.float32) * (1.0 - lr * decay) - (lr / bias1) * m / (s / bias2_sqrt + eps)
    if STOCHASTIC:  # bf16 keeps float32's top 16 bits: add random low bits, then cut them (rounds up with their odds)
        noise = tl.randint(seed, offs.to(tl.int32)) & 0xFFFF
        new = (((new.to(tl.uint32, bitcast=True) + noise) >> 16) << 16).to(tl.float32, bitcast=True)
    tl.store(p_ptr + offs, new.to(p_ptr.dtype.element_ty), mask=mask)
    ms = tl.max(tl.abs(m), axis=1)
    vs = tl.max(s, axis=1)
    tl.store(ms_ptr + rows, ms, mask=rmask)
    tl.store(vs_ptr + rows, vs, mask=rmask)
    qm = tl.floor(tl.sqrt(tl.abs(m) / tl.where(ms > 0, ms, 1.0)[:, None]) * 127.0 + 0.5)
    qm = tl.where(m < 0, -qm, qm)
    qv = tl.floor(tl.sqrt(s / tl.where(vs > 0, vs, 1.0)[:, None]) * 255.5)  # round(x * 255.5 - 0.5)
    qv = tl.minimum(tl.maximum(qv, 0.0), 255.0)
    tl.store(m_ptr + offs, qm.to(tl.int8), mask=mask)
    tl.store(v_ptr + offs, qv.to(tl.uint8), mask=mask)


def blocks(numel: int) -> int:
    return triton.cdiv(numel, QBLOCK)


def step(param, grad, codes_m, codes_v, scale_m, scale_v, *, lr, beta1, beta2, eps, weight_decay, step_number,
         seed=0):
    """One AdamW step of `param` (any float dtype, contiguous) in place, its moments' codes and scales updated; a bf16
    `param` rounded stochastically, its random bits drawn from `seed` (give each step and tensor its own)."""
    n = param.numel()
    # the interpreter runs each program in Python: few programs of many blocks; a GPU: 2,048 elements a program
    rows = min(triton.next_power_of_2(blocks(n)), 256) if interpreting() else 8
    _adamw8bit_kernel[(triton.cdiv(blocks(n), rows),)](
        param, grad.contiguous(), codes_m, codes_v, scale_m, scale_v, n, float(lr), float(beta1), float(beta2),
        float(eps), float(weight_decay), 1.0 - beta1 ** step_number, (1.0 - beta2 ** step_number) ** 0.5,
        int(seed) & 0x7FFFFFFF, ROWS=rows, QBLOCK=QBLOCK, STOCHASTIC=param.dtype == torch.bfloat16, num_warps=4)


def step_in_torch(param, grad, codes_m, codes_v, scale_m, scale_v, *, lr, beta1, beta2, eps, weight_decay,
                  step_number, seed=0):
    """The kernel's step in torch (decode, AdamW's update, encode), in place: where no Triton kernel runs (a CPU
    outside the interpreter) and the tests' reference. Its stochastic rounding draws other bits than the kernel's."""
    m = decode(codes_m, scale_m, False).view(param.shape)
    v = decode(codes_v, scale_v, True).view(param.shape)
    g = grad.float()
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bias1, bias2_sqrt = 1 - beta1 ** step_number, (1 - beta2 ** step_number) ** 0.5
    new = param.float() * (1 - lr * weight_decay) - lr / bias1 * m / (v.sqrt() / bias2_sqrt + eps)
    param.copy_(round_stochastically(new, seed) if param.dtype == torch.bfloat16 else new)
    for (codes, scale), (fresh_codes, fresh_scale) in (((codes_m, scale_m), encode(m, False)),
                                                        ((codes_v, scale_v), encode(v, True))):
        codes.copy_(fresh_codes)
        scale.copy_(fresh_scale)


def round_stochastically(x: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 `x` to bf16, each element rounded up or down with odds by its distance from either (as the kernel)."""
    generator = torch.Generator(device=x.device).manual_seed(int(seed))
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    return ((x.contiguous().view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def _blocked(flat: torch.Tensor) -> torch.Tensor:
    pad = (-flat.numel()) % QBLOCK
    return torch.nn.functional.pad(flat, (0, pad)).view(-1, QBLOCK)


def encode(moment: torch.Tensor, second: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of a float moment: int8 codes for the first, uint8 for the second (`second`)."""
    n = moment.numel()
    x = _blocked(moment.detach().reshape(-1).float())
    if second:
        s = x.clamp_min(0).sqrt()
        scale = s.amax(dim=1)
        codes = torch.floor((s / torch.where(scale > 0, scale, 1.0)[:, None]).sqrt() * V_STEPS).clamp(0, 255)
        return codes.reshape(-1)[:n].to(torch.uint8), scale
    scale = x.abs().amax(dim=1)
    codes = torch.floor((x.abs() / torch.where(scale > 0, scale, 1.0)[:, None]).sqrt() * M_STEPS + 0.5)
    return (torch.sign(x) * codes).reshape(-1)[:n].to(torch.int8), scale


def decode(codes: torch.Tensor, scale: torch.Tensor, second: bool) -> torch.Tensor:
    """The float32 moment (flat) that `codes` and `scale` stand for."""
    n = codes.numel()
    if second:
        c = (_blocked(codes.float()) + 0.5) / V_STEPS
        s = c * c * scale[:, None]
        return (s * s).reshape(-1)[:n]
    c = _blocked(codes.float()) / M_STEPS
    return (c * c.abs() * scale[:, None]).reshape(-1)[:n]
