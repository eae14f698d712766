"""Packed rows keep their samples apart: each sample's logits (and so its loss) in a packed batch are those of the
sample alone, for attention (Qwen3-MoE) and for Gated DeltaNet (Qwen3.5-MoE), on the reference DeltaNet (one sample
at a time) and on the fast path (one FLA call for the whole stream, the short convolution per sample or through
causal-conv1d's seq_idx). FLA and causal-conv1d need a GPU; here they are stand-ins that hold the real functions'
argument contract and compute what transformers' reference code computes for each sample alone."""

import importlib
import sys
import types
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F

from tests.training.tiny_lora import tiny_lora_model as _model
from training import linear_attention
from training.data import IGNORE, _pack, collate
from training.examples.tiny import TINY_CONFIG, TINY_QWEN3_5_CONFIG
from training.losses import causal_lm_loss
from training.attention import ROWS_KEY
from training.packing import boundaries, cu_seq_lens, model_inputs, with_host_ends

SEQ_LEN = 24


def _chunk_rule_alone(q, k, v, g, beta):
    """transformers' reference chunked rule (what a sample alone runs through) for one sample of the stream."""
    return linear_attention.torch_chunk_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]


class FakeFla:
    """flash-linear-attention's `chunk_gated_delta_rule` as far as the DeltaNet paths use it: the checks its real
    counterpart makes (batch 1, q and k with the key heads; packed input's cu_seqlens with their host copy), and the
    reference rule run over the stream as FLA runs it: sample by sample where told the boundaries, else as one
    sequence. Records each call's boundaries (None: none given)."""

    def __init__(self):
        self.calls = []

    def chunk_gated_delta_rule(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        assert q.shape[0] == 1 and q.shape[2] == k.shape[2] and v.shape[2] % q.shape[2] == 0
        assert scale is None and use_qk_l2norm_in_kernel
        assert initial_state is None and not output_final_state and not kwargs
        if cu_seqlens is None:
            assert cu_seqlens_cpu is None
            self.calls.append(None)
            return _chunk_rule_alone(q, k, v, g, beta), None
        assert cu_seqlens.dtype == torch.long and cu_seqlens.device == q.device
        assert cu_seqlens_cpu.device.type == "cpu" and cu_seqlens_cpu.tolist() == cu_seqlens.tolist()
        assert cu_seqlens_cpu[-1] == q.shape[1]
        self.calls.append(cu_seqlens_cpu.tolist())
        ends = cu_seqlens_cpu.tolist()
        parts = [_chunk_rule_alone(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e])
                 for s, e in pairwise(ends)]
        return torch.cat(parts, dim=1), None


class FakeCausalConv1d:
    """causal-conv1d's `causal_conv1d_fn` with seq_idx: channel-last input only, as the real kernel."""

    def __init__(self):
        self.calls = 0

    def causal_conv1d_fn(self, x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        assert x.stride(1) == 1 and seq_idx.dtype == torch.int32 and seq_idx.shape == (x.shape[0], x.shape[2])
        assert activation in ("silu", "swish") and initial_states is None and not return_final_states
        self.calls += 1
        out = torch.zeros_like(x)
        for sample in seq_idx[0].unique():
            where = (seq_idx[0] == sample).nonzero().flatten()
            part = x[:, :, where]
            conv = F.conv1d(part, weight[:, None], bias, padding=weight.shape[1] - 1, groups=weight.shape[0])
            out[:, :, where] = F.silu(conv[:, :, :part.shape[2]])
        return out


@pytest.fixture(params=["reference", "fla", "fla+causal-conv1d"])
def deltanet(request, monkeypatch):
    """Which DeltaNet kernels the box has; yields (path, the stand-ins in use)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe  # noqa: F401 - resolved before the stand-ins

    fakes = {}
    if request.param.startswith("fla"):
        fakes["fla"] = FakeFla()
        package = types.ModuleType("fla.ops.gated_delta_rule")
        package.chunk_gated_delta_rule = fakes["fla"].chunk_gated_delta_rule
        monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", package)
        monkeypatch.setattr(linear_attention, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))
    if request.param.endswith("causal-conv1d"):
        fakes["conv"] = FakeCausalConv1d()
        monkeypatch.setitem(sys.modules, "causal_conv1d", types.SimpleNamespace(
            causal_conv1d_fn=fakes["conv"].causal_conv1d_fn))
    linear_attention.fla_chunk_rule.cache_clear()
    linear_attention.conv1d_kernel.cache_clear()
    yield request.param, fakes
    linear_attention.fla_chunk_rule.cache_clear()
    linear_attention.conv1d_kernel.cache_clear()


def _samples():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, 260, (n,), generator=generator).tolist() for n in (7, 5, 9, 11, 6, 30)]


def _each_sample_scores_as_it_does_alone(config, attention=None):
    model = _model(config)
    if attention:  # the attention implementation to run instead of the trainer's
        model.config._attn_implementation = attention
    samples = _samples()
    rows = _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0)
    batch = with_host_ends(model, collate("cpt", rows, pad_id=0))
    assert batch["input_ids"].shape[0] < len(samples)  # several samples share a row
    with torch.no_grad():
        packed = model(**model_inputs(model, batch)).logits
        unpacked = model(input_ids=batch["input_ids"], use_cache=False).logits
        # Where each sample sits: its row and first column, found by its tokens.
        place, losses = {}, []
        for row, positions in enumerate(batch["position_ids"].tolist()):
            for column, position in enumerate(positions):
                if position == 0:
                    place.setdefault(row, []).append(column)
        placed = [(row, column) for row in sorted(place) for column in place[row]]
        for ids in samples:
            for start in range(0, len(ids), SEQ_LEN):
                piece = ids[start:start + SEQ_LEN]
                row, column = next((r, c) for r, c in placed
                                   if batch["input_ids"][r, c:c + len(piece)].tolist() == piece)
                alone = model(input_ids=torch.tensor([piece]), use_cache=False).logits[0]
                torch.testing.assert_close(packed[row, column:column + len(piece)], alone, rtol=1e-5, atol=1e-5)
                if column:  # the same rows run as one stream let the earlier samples in: the test can tell
                    losses.append((unpacked[row, column:column + len(piece)] - alone).abs().max())
    assert losses and max(losses) > 1e-3
    return batch


def test_each_sample_in_a_packed_batch_scores_as_it_does_alone_with_attention_only():
    _each_sample_scores_as_it_does_alone(TINY_CONFIG)


@pytest.mark.parametrize("attention", ["packed_sdpa", "sdpa"])
def test_each_sample_in_a_packed_batch_scores_as_it_does_alone_with_deltanet(deltanet, attention):
    # packed_sdpa (the trainer's): the DeltaNet layers read the rows' device boundaries; sdpa: their host ends.
    path, fakes = deltanet
    batch = _each_sample_scores_as_it_does_alone(TINY_QWEN3_5_CONFIG, attention)
    deltanet_layers = sum(kind == "linear_attention" for kind in _model(TINY_QWEN3_5_CONFIG).config.layer_types)
    if "fla" in fakes:
        # One call per DeltaNet layer for the whole packed batch: told every sample's boundaries on the host path,
        # none on the device path (each sample's first token empties the state instead).
        ends = list(boundaries(batch["position_ids"])["sample_ends"]) if attention == "sdpa" else None
        assert fakes["fla"].calls == [ends] * deltanet_layers
    if "conv" in fakes:
        assert fakes["conv"].calls == deltanet_layers


def test_the_boundaries_cover_every_row_and_are_on_the_host_and_the_device():
    found = boundaries(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]))
    assert found["sample_ends"] == (0, 3, 5, 7, 10)
    assert found["cu_seq_lens_q"].tolist() == [0, 3, 5, 7, 10] and found["cu_seq_lens_q"].dtype == torch.int32
    assert found["max_length_q"] == found["max_length_k"] == 3


def test_the_trainers_packed_batches_reach_the_deltanet_layers_without_a_host_value():
    samples = _samples()
    rows = _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0)[:2]
    model = _model(TINY_QWEN3_5_CONFIG)
    batch = with_host_ends(model, collate("cpt", rows, pad_id=0))
    # All tensors, as CUDA graphs take them: the DeltaNet layers read the boundaries the attention reads.
    assert all(torch.is_tensor(value) for value in batch.values())
    # A meta tensor holds no values: reading one back on the host would raise.
    inputs = model_inputs(model, {key: value.to("meta") for key, value in batch.items()})
    assert "sample_ends" not in inputs and "cu_seq_lens_q" not in inputs
    assert inputs[ROWS_KEY].cu_seq_lens.shape == batch["cu_seq_lens"].shape
    # Families without linear attention keep all-tensor batches too.
    assert "sample_ends" not in with_host_ends(_model(TINY_CONFIG), collate("cpt", rows, pad_id=0))


def test_where_the_attention_is_not_told_its_rows_the_deltanet_layers_get_host_ends_without_reading_the_device():
    samples = _samples()
    rows = _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0)[:2]
    model = _model(TINY_QWEN3_5_CONFIG)
    model.config._attn_implementation = "sdpa"
    batch = with_host_ends(model, collate("cpt", rows, pad_id=0))
    assert batch["sample_ends"] == boundaries(batch["position_ids"])["sample_ends"]
    on_meta = {key: value.to("meta") if torch.is_tensor(value) else value for key, value in batch.items()}
    inputs = model_inputs(model, on_meta)
    assert inputs["sample_ends"] == batch["sample_ends"]
    assert inputs["cu_seq_lens_q"].shape == (len(batch["sample_ends"]),)  # exact: the padding is cut off
    assert inputs["max_length_q"] == max(b - a for a, b in pairwise(batch["sample_ends"]))


def test_the_packed_loss_is_the_token_mean_of_the_samples_losses_alone():
    model = _model(TINY_QWEN3_5_CONFIG)
    samples = _samples()[:3]
    batch = collate("cpt", _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0), pad_id=0)
    with torch.no_grad():
        packed, _ = causal_lm_loss(model, batch, {"kind": "cpt"}, {})
        total, count = 0.0, 0
        for ids in samples:
            x = torch.tensor([ids])
            loss, _ = causal_lm_loss(model, {"input_ids": x, "labels": x}, {"kind": "cpt"}, {})
            total, count = total + float(loss) * (len(ids) - 1), count + len(ids) - 1
    assert float(packed) == pytest.approx(total / count, rel=1e-5)


def test_packing_keeps_samples_whole_and_their_first_token_out_of_the_loss():
    rows = _pack([([5] * 10, [5] * 10), ([6] * 10, [6] * 10), ([7] * 30, [7] * 30)], 24, pad_id=0)
    assert [r["input_ids"].count(6) for r in rows] == [10, 0, 0]  # 5s and 6s share a row; 7s do not fit
    assert rows[0]["position_ids"] == list(range(10)) * 2 + list(range(4))
    assert rows[0]["labels"][0] == rows[0]["labels"][10] == IGNORE and rows[0]["labels"][20:] == [IGNORE] * 4
    assert rows[1]["input_ids"] == [7] * 24 and rows[2]["input_ids"][:6] == [7] * 6  # cut into seq_len pieces
    assert rows[2]["position_ids"][:6] == list(range(6))


@pytest.mark.parametrize("model_type, module, layer_class", [
    ("qwen3_next", "qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet"),
    ("qwen3_5_moe_text", "qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"),
])
def test_the_fast_path_makes_what_the_layer_makes_of_each_sample_alone(model_type, module, layer_class):
    # Qwen3-Next fuses its projections differently (in_proj_qkvz, in_proj_ba); both are read the layer's own way.
    from transformers import AutoConfig

    fields = {key: value for key, value in TINY_QWEN3_5_CONFIG.items() if key != "model_type"}
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    layer = getattr(importlib.import_module(f"transformers.models.{module}"), layer_class)(config, 0).float()
    hidden = torch.randn(2, 10, config.hidden_size)
    ends = (0, 4, 10, 13, 20)
    fake = FakeFla()
    with torch.no_grad():
        fast = linear_attention.fast_packed_forward(layer, hidden, ends, fake.chunk_gated_delta_rule)
        torch.testing.assert_close(fast, linear_attention.reference_packed_forward(layer, hidden, ends),
                                   rtol=1e-5, atol=1e-5)
    assert fake.calls == [list(ends)]


# Samples shorter than the short convolution (1 and 2 tokens), several starting in one 64-token chunk of the
# chunked rule, and one running across chunks; a row boundary inside the stream; the padding after the last end.
LENGTHS = ((1, 2, 5, 3, 60, 9), (70, 1, 9))


@pytest.mark.parametrize("model_type, module, layer_class", [
    ("qwen3_next", "qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet"),
    ("qwen3_5_moe_text", "qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"),
])
def test_the_device_path_makes_what_the_layer_makes_of_each_sample_alone_and_the_same_gradients(
        model_type, module, layer_class):
    from transformers import AutoConfig

    fields = {key: value for key, value in TINY_QWEN3_5_CONFIG.items() if key != "model_type"}
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    layer = getattr(importlib.import_module(f"transformers.models.{module}"), layer_class)(config, 0).double()
    positions = [[i for n in row for i in range(n)] for row in LENGTHS]
    cu = cu_seq_lens(positions, width=16)
    ends = tuple(boundaries(torch.tensor(positions))["sample_ends"])
    assert cu[-1] == cu[len(ends)] == 160 and len(ends) < 16
    hidden = torch.randn(2, 80, config.hidden_size, dtype=torch.float64)

    def run(forward):
        x = hidden.clone().requires_grad_()
        layer.zero_grad()
        out = forward(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        return out.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}

    fake = FakeFla()
    device = run(lambda x: linear_attention.device_packed_forward(layer, x, cu, fake.chunk_gated_delta_rule))
    reference = run(lambda x: linear_attention.reference_packed_forward(layer, x, ends))
    # The rule runs in float32 (transformers' casts), where a decay summed past a start's RESET_DECAY keeps fewer bits.
    close = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(device[0], reference[0], **close)
    torch.testing.assert_close(device[1], reference[1], **close)
    assert device[2].keys() == reference[2].keys() and "A_log" in "".join(device[2])
    for name, grad in reference[2].items():
        torch.testing.assert_close(device[2][name], grad, **close, msg=name)
    assert fake.calls == [None]  # one call for the whole stream, told no boundary
    # Run as one stream with no boundary, the samples mix: the test can tell.
    mixed = linear_attention.device_packed_forward(layer, hidden, torch.tensor([0, 160, 160]),
                                                   fake.chunk_gated_delta_rule)
    assert (mixed - reference[0]).abs().max() > 1e-2


def test_the_device_path_keeps_the_convolutions_input_alone_for_the_backward():
    """The short convolution and its activation are made again in the backward: of the (1, channels, tokens)
    activations only the convolution's input is kept, not its result nor the activation's input."""
    from transformers import AutoConfig

    fields = {key: value for key, value in TINY_QWEN3_5_CONFIG.items() if key != "model_type"}
    config = AutoConfig.for_model("qwen3_5_moe_text", **fields)
    torch.manual_seed(0)
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    layer = Qwen3_5MoeGatedDeltaNet(config, 0).float().requires_grad_(False)
    positions = [[i for n in row for i in range(n)] for row in LENGTHS]
    cu = cu_seq_lens(positions, width=16)
    x = torch.randn(2, 80, config.hidden_size, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = linear_attention.device_packed_forward(layer, x, cu, FakeFla().chunk_gated_delta_rule)
    channels = 2 * layer.key_dim + layer.value_dim
    wide = {t.untyped_storage().data_ptr() for t in kept if tuple(t.shape) == (1, channels, 160)}
    assert len(wide) == 1
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_deltanet_models_packed_batch_gives_the_same_gradients_with_its_layers_checkpointed():
    """The short convolution's own recomputation nests inside the trainer's layer checkpointing."""
    samples = _samples()
    rows = _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0)
    grads = []
    for checkpointed in (False, True):
        model = _model(TINY_QWEN3_5_CONFIG)
        model.train()
        if checkpointed:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        batch = with_host_ends(model, collate("cpt", rows, pad_id=0))
        model(**model_inputs(model, batch), labels=batch["labels"]).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("linear_attn" in name for name in grads[0])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_whole_rows_take_the_device_path_and_score_as_the_layers_own_forward(monkeypatch):
    """Unmasked whole rows (RowSegments.whole_rows) go through the same one-pass path as packed ones, each row one
    sample: what transformers' own forward makes of them, gradients included."""
    model = _model(TINY_QWEN3_5_CONFIG)
    ids = torch.randint(3, 260, (2, SEQ_LEN), generator=torch.Generator().manual_seed(4))
    inputs = model_inputs(model, {"input_ids": ids})
    assert ROWS_KEY in inputs and inputs[ROWS_KEY].cu_seq_lens is None
    calls = []
    device_path = linear_attention.device_packed_forward
    monkeypatch.setattr(linear_attention, "device_packed_forward",
                        lambda *args: calls.append(args[2].tolist()) or device_path(*args))

    def scored(**kwargs):
        model.zero_grad()
        logits = model(**kwargs).logits
        (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    rows, rows_grads = scored(**inputs)
    deltanet_layers = sum(kind == "linear_attention" for kind in model.config.get_text_config().layer_types)
    assert calls == [[0, SEQ_LEN, 2 * SEQ_LEN]] * deltanet_layers
    own, own_grads = scored(input_ids=ids, use_cache=False)
    assert len(calls) == deltanet_layers  # no row segments: the layers' own forward
    torch.testing.assert_close(rows, own, rtol=1e-4, atol=1e-4)
    for name, grad in own_grads.items():
        torch.testing.assert_close(rows_grads[name], grad, rtol=1e-4, atol=1e-4, msg=name)
