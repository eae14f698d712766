"""The Triton kernels (run by Triton's interpreter on the CPU, fp32) against the per-expert loop."""

import contextlib

import pytest
import torch
import triton

from training.grouped_ops import BACKENDS
from training.kernels import grouped_gemm as grouped_gemm_module
from training.kernels.grouped_gemm import grouped_gemm
from training.moe_lora import route

LOOP, TRITON, SCATTER = BACKENDS["loop"], BACKENDS["triton"], BACKENDS["triton_scatter"]


@pytest.fixture
def routed(make_routing):
    gen = torch.Generator().manual_seed(0)
    index, weights = make_routing(num_tokens=23, num_experts=6, top_k=2, empty=(0, 4), generator=gen)
    groups, rows, slots, order = route(index, 6)
    return groups, rows, slots, weights, gen


def test_it_has_empty_and_uneven_groups(routed):
    counts = routed[0].host_counts
    assert counts[0] == 0 and counts[4] == 0
    assert len({c for c in counts if c}) > 1


@pytest.mark.parametrize("layout", ["gate_up_forward", "down_forward", "gate_up_input_grad", "down_input_grad"])
@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("hidden, inter", [(40, 24), (64, 32)])  # K with a tail, K a multiple of the block
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointers"])
def test_it_computes_the_grouped_matmul_like_the_loop(routed, layout, with_lora, hidden, inter, tma):
    groups, rows, _, _, gen = routed
    rank, experts = 8, 6
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen)
    down = torch.randn(experts, hidden, inter, generator=gen)
    # (weight as an (E, N, K) view, input width K, whether the input rows are gathered from tokens)
    weight, gather = {
        "gate_up_forward": (gate_up, True),
        "down_forward": (down, False),
        "gate_up_input_grad": (gate_up.transpose(1, 2), False),
        "down_input_grad": (down.transpose(1, 2), True),
    }[layout]
    n, k = weight.shape[1], weight.shape[2]
    m = rows.shape[0]
    x = torch.randn(23 if gather else m, k, generator=gen)
    lora = None
    if with_lora:  # l1 as a transposed view: any strides are accepted
        l1 = torch.randn(experts, k, rank, generator=gen).transpose(1, 2)
        lora = (l1, torch.randn(experts, n, rank, generator=gen), 0.5)
    row_index = rows if gather else None
    got, got_z = grouped_gemm(x, weight, groups.counts, rows=row_index, lora=lora, tma=tma)
    want, want_z = LOOP.mm(x, weight, groups, rows=row_index, lora=lora)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if with_lora:  # the rank-wide product x l1^T, which the backward needs, comes out of the same kernel
        torch.testing.assert_close(got_z, want_z, rtol=1e-4, atol=1e-4)
    else:
        assert got_z is None


# Group sizes around one, two and several row blocks of the interpreter's 32 rows (and the H200's 128): no rows,
# a few, exactly half a block, just over, exactly a block, a few rows over, several blocks and a remainder.
GROUP_COUNTS = [0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 79, 80, 81, 96, 97, 129, 144, 145, 257, 300]


@contextlib.contextmanager
def tma_store(quarters):
    """Within it the TMA kernel stores its tiles whole or a quarter of the columns at a time (tuning's choice on a
    GPU; the interpreter otherwise runs the first)."""
    kernel = grouped_gemm_module._grouped_gemm_tma_kernel
    config = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "FLATTEN": True, "QUARTERS": quarters},
                           num_warps=4, num_stages=1)
    saved, kernel.configs, kernel.cache = kernel.configs, [config], {}
    try:
        yield
    finally:
        kernel.configs, kernel.cache = saved, {}


@pytest.mark.parametrize("quarters", [True, False], ids=["quartered store", "whole store"])
@pytest.mark.parametrize("gather, transposed", [(True, False), (False, True)])
def test_groups_around_block_boundaries_store_every_row_once(gather, transposed, quarters):
    gen = torch.Generator().manual_seed(3)
    counts = torch.tensor(GROUP_COUNTS, dtype=torch.int32)
    experts, n, k, rank = len(GROUP_COUNTS), 48, 64, 8
    m = int(counts.sum())
    weight = torch.randn(experts, k, n, generator=gen).transpose(1, 2) if transposed else \
        torch.randn(experts, n, k, generator=gen)
    tokens = m // 2
    rows = torch.randint(0, tokens, (m,), generator=gen) if gather else None
    x = torch.randn(tokens if gather else m, k, generator=gen)
    lora = (torch.randn(experts, rank, k, generator=gen), torch.randn(experts, n, rank, generator=gen), 0.5)
    with tma_store(quarters):
        got, _ = grouped_gemm(x, weight, counts, rows=rows, lora=lora, tma=True)
    xs = x[rows] if gather else x
    want = torch.cat([xs[a:b] @ weight[e].T + 0.5 * (xs[a:b] @ lora[0][e].T) @ lora[1][e].T
                      for e, (a, b) in enumerate(zip(counts.cumsum(0) - counts, counts.cumsum(0), strict=True))])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gather", [False, True])
def test_it_computes_lora_weight_grads_like_the_loop_with_zero_for_empty_experts(routed, gather):
    groups, rows, _, _, gen = routed
    m = rows.shape[0]
    p = torch.randn(m, 8, generator=gen)
    q = torch.randn(23 if gather else m, 40, generator=gen)
    q_rows = rows if gather else None
    got = TRITON.weight_grad(p, q, groups, q_rows=q_rows, scale=2.0)
    want = LOOP.weight_grad(p, q, groups, q_rows=q_rows, scale=2.0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got[0].abs().max() == 0 and got[4].abs().max() == 0


def test_it_weights_each_row_of_the_weight_grad(routed):
    groups, rows, _, _, gen = routed
    m = rows.shape[0]
    p, q = torch.randn(m, 8, generator=gen), torch.randn(m, 40, generator=gen)
    row_scale = torch.rand(m, generator=gen)
    got = TRITON.weight_grad(p, q, groups, scale=0.5, row_scale=row_scale)
    want = LOOP.weight_grad(p * row_scale.unsqueeze(-1), q, groups, scale=0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_it_moves_lora_b_between_pefts_layout_and_the_kernels(routed):
    gen = routed[-1]
    experts, rank, out = 6, 8, 40
    peft_b = torch.randn(out, rank * experts, generator=gen)
    kernel_b = TRITON.peft_b_to_experts(peft_b, experts, torch.float16)
    assert kernel_b.shape == (experts, rank, out) and kernel_b.dtype == torch.float16
    # B_e[o, i] is peft's column i * E + e
    torch.testing.assert_close(kernel_b[4, 3, 7].float(), peft_b[7, 3 * experts + 4].half().float())
    torch.testing.assert_close(kernel_b, LOOP.peft_b_to_experts(peft_b, experts, torch.float16))
    back = TRITON.experts_to_peft_b(kernel_b.float(), torch.float32)
    torch.testing.assert_close(back, peft_b.half().float())


@pytest.mark.parametrize("weighted", [False, True])
def test_it_combines_each_tokens_expert_outputs(routed, weighted):
    groups, rows, slots, weights, gen = routed
    src = torch.randn(rows.shape[0], 40, generator=gen)
    w = weights if weighted else None
    torch.testing.assert_close(TRITON.combine(src, slots, w), LOOP.combine(src, slots, w))
    # Slot k of token t holds that token's row: combining with weight 1 is the sum over its choices.
    assert torch.equal(rows[slots], torch.arange(slots.shape[0]).unsqueeze(1).expand_as(slots))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("layout", ["down_forward", "gate_up_input_grad"])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointers"])
def test_the_scattering_product_equals_the_product_then_the_combine(make_routing, weighted, with_lora, layout, tma):
    """The combine in the grouped product's epilogue (path triton_scatter): each row added into its token, weighted,
    equals storing the rows and combining them, for both products that feed a combine in the block."""
    gen = torch.Generator().manual_seed(5)
    index, weights = make_routing(num_tokens=23, num_experts=6, top_k=2, empty=(0, 4), generator=gen)
    groups, rows, slots, order = route(index, 6)
    inter, hidden, rank = 24, 40, 8
    weight = torch.randn(6, hidden, inter, generator=gen) if layout == "down_forward" else \
        torch.randn(6, 2 * inter, hidden, generator=gen).transpose(1, 2)
    n, k = weight.shape[1], weight.shape[2]
    x = torch.randn(rows.shape[0], k, generator=gen)
    lora = (torch.randn(6, rank, k, generator=gen), torch.randn(6, n, rank, generator=gen), 0.5) if with_lora \
        else None
    w = weights if weighted else None
    out = torch.zeros(23, n)
    grouped_gemm(x, weight, groups.counts, lora=lora, tma=tma,
                 scatter=(rows, order, w.reshape(-1) if weighted else None, out))
    want = LOOP.mm_combine(x, weight, groups, rows, slots, order, w, lora=lora)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    got = SCATTER.mm_combine(x, weight, groups, rows, slots, order, w, lora=lora)  # as the block calls it
    assert got.dtype == x.dtype and got.shape == (23, n)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_scattering_product_refuses_an_output_it_cannot_add_into(routed):
    groups, rows, _, _, gen = routed
    x, weight = torch.randn(rows.shape[0], 8, generator=gen), torch.randn(6, 16, 8, generator=gen)
    for out in (torch.zeros(23, 16, dtype=torch.float16), torch.zeros(23, 12), torch.zeros(16, 23).t()):
        with pytest.raises(ValueError, match="float32"):
            grouped_gemm(x, weight, groups.counts, scatter=(rows, None, None, out))
    with pytest.raises(ValueError, match="each of the"):
        grouped_gemm(x, weight, groups.counts, scatter=(rows[:-1], None, None, torch.zeros(23, 16)))


@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("inter", [40, 32])  # a column tail, a multiple of the block
def test_it_computes_the_gated_activation_and_its_backward_like_the_loop(make_routing, with_lora, inter):
    gen = torch.Generator().manual_seed(1)
    index, weights = make_routing(num_tokens=23, num_experts=6, top_k=2, empty=(0, 4), generator=gen)
    groups, rows, slots, order = route(index, 6)
    m, rank = rows.shape[0], 8
    gate_up = torch.randn(m, 2 * inter, generator=gen)
    g = torch.randn(m, inter, generator=gen)
    # The factors as the block passes them: A (E, r, I) as a transposed view (any strides), B (E, r, 2I).
    a = torch.randn(6, inter, rank, generator=gen).transpose(1, 2) if with_lora else None
    b = torch.randn(6, rank, 2 * inter, generator=gen) if with_lora else None

    h, z = TRITON.swiglu(gate_up, groups, a)
    want_h, want_z = LOOP.swiglu(gate_up, groups, a)
    torch.testing.assert_close(h, want_h)
    got = TRITON.swiglu_backward(gate_up, g, weights, order, groups, b)
    want = LOOP.swiglu_backward(gate_up, g, weights, order, groups, b)
    for got_part, want_part in zip(got, want, strict=True):
        torch.testing.assert_close(got_part, want_part, rtol=1e-5, atol=1e-5)
    if with_lora:  # the rank-wide products come out of the same kernels
        torch.testing.assert_close(z, want_z, rtol=1e-5, atol=1e-5)
    else:
        assert z is None and got[3] is None
    # Each routing weight's gradient is <G, h> of its own sorted row, in the routing weights' (T, K) layout;
    # the row weights come back in sorted order.
    torch.testing.assert_close(got[1], (g * want_h).sum(-1)[slots], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], weights.reshape(-1)[order])
    # Asked for, the backward gives back the forward's activation itself, bit for bit, so the block need not keep it.
    h_again = torch.full_like(h, float("nan"))
    again = TRITON.swiglu_backward(gate_up, g, weights, order, groups, b, h=h_again)
    assert torch.equal(h_again, h)
    for again_part, got_part in zip(again, got, strict=True):
        assert (again_part is None and got_part is None) or torch.equal(again_part, got_part)


@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(23, 6, 2), (150, 8, 3), (1, 4, 1), (700, 12, 4)])
def test_it_sorts_pairs_by_expert_exactly_like_a_stable_sort(make_routing, num_tokens, num_experts, top_k):
    gen = torch.Generator().manual_seed(num_tokens)
    index, _ = make_routing(num_tokens=num_tokens, num_experts=num_experts, top_k=top_k, empty=(1,),
                                  generator=gen)
    groups, rows, slots, order = route(index, num_experts, "triton")
    want_groups, want_rows, want_slots, want_order = route(index, num_experts, "loop")
    assert groups.host_counts == want_groups.host_counts and groups.host_counts[1] == 0
    assert torch.equal(groups.ends, want_groups.ends)
    assert torch.equal(order, want_order) and torch.equal(rows, want_rows) and torch.equal(slots, want_slots)
    # Read in sorted order, the pairs' experts ascend.
    flat = index.reshape(-1)
    assert torch.equal(flat[order], torch.sort(flat, stable=True).values)


@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("inter", [40, 32])  # a column tail, a multiple of the block
def test_the_gated_product_makes_gate_up_and_its_activation_like_the_product_then_the_activation(
        make_routing, with_lora, inter):
    """The gate/up product with SwiGLU (and the down projection's LoRA input h @ A2^T) in its epilogue (path
    triton_fused) gives what the product and then the activation kernel give, gathered rows, empty experts and all."""
    from training.kernels.grouped_gemm import gated_grouped_gemm

    gen = torch.Generator().manual_seed(2)
    index, _ = make_routing(num_tokens=23, num_experts=6, top_k=2, empty=(0, 4), generator=gen)
    groups, rows, _, _ = route(index, 6)
    hidden, rank = 48, 8
    x = torch.randn(23, hidden, generator=gen)
    w1 = torch.randn(6, 2 * inter, hidden, generator=gen)
    lora = (torch.randn(6, rank, hidden, generator=gen), torch.randn(6, 2 * inter, rank, generator=gen), 0.5) \
        if with_lora else None
    a2 = torch.randn(6, inter, rank, generator=gen).transpose(1, 2) if with_lora else None  # (E, r, I), any strides
    gate_up, z, h, z2 = gated_grouped_gemm(x, w1, groups.counts, rows=rows, lora=lora, a2=a2)
    want_gate_up, want_z = LOOP.mm(x, w1, groups, rows=rows, lora=lora)
    want_h, want_z2 = LOOP.swiglu(want_gate_up, groups, a2)
    torch.testing.assert_close(gate_up, want_gate_up, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, want_h, rtol=1e-4, atol=1e-4)
    # The activation is made from the stored gate_up, as the backward remakes it: bit for bit.
    assert torch.equal(h, TRITON.swiglu(gate_up, groups)[0])
    if with_lora:
        torch.testing.assert_close(z, want_z, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(z2, want_z2, rtol=1e-4, atol=1e-4)
    else:
        assert z is None and z2 is None


def test_the_gated_product_declines_weights_it_cannot_read_as_gate_up_rows(routed):
    from training.kernels.grouped_gemm import gated_grouped_gemm

    groups, rows, _, _, gen = routed
    x = torch.randn(23, 16, generator=gen)
    transposed = torch.randn(6, 16, 24, generator=gen).transpose(1, 2)  # (E, 24, 16) read column-major
    assert gated_grouped_gemm(x, transposed, groups.counts, rows=rows) is None
