"""CUDA-graph micro-steps: what is captured, and (on a GPU) that replaying trains exactly as eager steps do."""

import contextlib
import copy
import json
import os
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training.graphs import GRAPH_SAFE, _signature

gpu = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                         reason="CUDA graphs need a GPU (run with TRITON_INTERPRET=0)")
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the experts' Triton path on the CPU needs Triton's interpreter")


def test_only_fixed_shape_tensor_batches_of_sync_free_losses_are_captured():
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    key = _signature(batch, "sft", 0.125)
    assert key == _signature({k: v.clone() for k, v in batch.items()}, "sft", 0.125)
    assert key != _signature({k: v[:, :4] for k, v in batch.items()}, "sft", 0.125)  # another shape
    assert key != _signature(batch, "sft", 0.25)  # another accumulation count
    assert _signature({"prompts": [[1, 2]], "records": [{}]}, "grpo", 1.0) is None  # host lists: never captured


def test_a_micro_step_a_capture_refuses_runs_eagerly_and_the_log_says_where(monkeypatch, caplog):
    from training import graphs

    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def copy_in_from_the_host(*args):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")

    monkeypatch.setattr(graphs.MicroStepGraphs, "_capture", copy_in_from_the_host)
    weight = torch.nn.Parameter(torch.ones(3))
    runner = graphs.MicroStepGraphs([weight], warmup=0)
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.zeros(1, 4, dtype=torch.long)}

    def loss_fn(model, batch, phase, ctx):
        return (weight * 2).sum(), {}

    with caplog.at_level("WARNING", logger="training.graphs"):
        loss, _ = runner.run(None, loss_fn, batch, {"kind": "sft"}, {}, 0.5)
    assert loss.item() == 6.0 and weight.grad.tolist() == [1.0, 1.0, 1.0]  # ran eagerly, scaled
    assert not runner.replaying and len(runner.failed) == 1
    assert "Cannot copy between CPU and CUDA" in caplog.text
    assert "test_graphs.py:" in caplog.text and "copy_in_from_the_host" in caplog.text


@gpu
def test_replayed_micro_steps_train_like_eager_ones(tiny_config):
    """Three optimizer steps of four micro-batches: eager, then with graphs (two eager warm-ups, the capture, and
    replays across steps, with in-place zeroing in between, gradients added in place by the experts' kernels). Same
    losses, same adapter."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    base = Qwen3MoeForCausalLM(tiny_config).to("cuda", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = [{"input_ids": ids, "labels": ids}
               for ids in torch.randint(0, 64, (4, 2, 16), device="cuda", generator=gen)]

    eager_losses, eager_params, _ = _three_cpt_steps(base, lambda model: batches, False)
    graph_losses, graph_params, graphs = _three_cpt_steps(base, lambda model: batches, True)
    assert graphs.replaying
    assert graph_losses == pytest.approx(eager_losses, rel=1e-3)
    assert eager_losses[-1] < eager_losses[0]
    for got, want in zip(graph_params, eager_params, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


@gpu
@pytest.mark.parametrize("kind", ["dpo", "kto"])
def test_replayed_preference_micro_steps_train_like_eager_ones(kind, tiny_config):
    """Four optimizer steps of four DPO/KTO micro-batches padded to two length buckets, taken in turn: eager, then
    with graphs (per bucket two eager warm-ups, the capture, then replays, the two graphs sharing one pool). Same
    losses, tokens, accuracy and margin or KL, same adapter; the reference scored as the trainer does."""
    from transformers import Qwen3MoeForCausalLM

    from training import moe_lora
    from training.data import collate
    from training.graphs import MicroStepGraphs
    from training.lora import attach_lora, randomize_routed_lora_b
    from training.losses import LOSSES
    from training.distributed import OneRank
    from training.phase import PhaseLoss, Trainee, lr_lambda, score_reference, to_device
    from training.train import parameter_groups

    seq_len, device = 256, torch.device("cuda")  # buckets 128, 192, 256
    tiny_config.max_position_embeddings = seq_len
    torch.manual_seed(0)
    base = Qwen3MoeForCausalLM(tiny_config).to(device, torch.bfloat16)
    rng = random.Random(0)

    def pair(length):
        prompt = rng.randint(1, length // 2)
        return [rng.randrange(3, 64) for _ in range(prompt)], [rng.randrange(3, 64) for _ in range(length - prompt)]

    # Micro-batch m holds items 2m and 2m + 1: the longest pair of m = 0 and 2 fits in 128 tokens, of 1 and 3 in 256.
    if kind == "dpo":
        lengths = [(100, 80), (60, 120), (200, 70), (90, 150), (110, 100), (40, 90), (130, 250), (60, 60)]
        items = [{"chosen": pair(chosen), "rejected": pair(rejected)} for chosen, rejected in lengths]
    else:
        lengths = [100, 80, 200, 60, 120, 90, 240, 50]
        items = [{"pair": pair(n), "desirable": i % 3 != 0} for i, n in enumerate(lengths)]
    phase = {"kind": kind, "beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.33}
    ctx = {"device": device}

    def train(use_graphs):
        torch.manual_seed(1)
        model = attach_lora(copy.deepcopy(base), r=4, alpha=8)
        randomize_routed_lora_b(model, generator=torch.Generator().manual_seed(1))
        reference = score_reference(model, kind, items, 2, 0, device)
        # A reference a little off the policy, so that no margin or KL starts at its edge (0), where rounding
        # alone would tip the accuracy or the clamp.
        reference = reference + torch.tensor([[2.0, 0.0], [-2.0, 0.0]] * 4) if kind == "dpo" else reference - 0.5
        batches = []
        for m in range(4):
            index = [2 * m, 2 * m + 1]
            batch = collate(kind, [items[i] for i in index], 0, seq_len)
            batch["ref_logps"] = (torch.cat([reference[index, 0], reference[index, 1]]) if kind == "dpo"
                                  else reference[index])
            batches.append(to_device(batch, device))
        groups = parameter_groups(model)
        optimizer = torch.optim.AdamW(groups["trainable"], lr=1e-3, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 10, 1.0))
        graphs = MicroStepGraphs(groups["trainable"], max_graphs=3) if use_graphs else None
        with moe_lora.grads_accumulated_in_place(model) if use_graphs else contextlib.nullcontext():
            trainee = Trainee(model, groups, OneRank(device), graphs, max_grad_norm=1.0)
            records = [trainee.optimizer_step(batches, PhaseLoss(LOSSES[kind], phase, ctx), optimizer, scheduler)
                       for _ in range(4)]
        widths = [b["input_ids"].shape[1] for b in batches]
        return records, [p.detach().float().clone() for p in groups["trainable"]], graphs, widths

    eager, eager_params, _, widths = train(False)
    replayed, graph_params, graphs, _ = train(True)
    assert widths == [128, 256, 128, 256]
    assert len(graphs.captured) == 2 and not graphs.failed
    for got, want in zip(replayed, eager, strict=True):
        assert got["tokens"] == want["tokens"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-3)
        # Sums of about a hundred bf16 log-probs: replays and eager steps part by rounding (atomic adds in the
        # backward), a few hundredths of a margin.
        if kind == "dpo":
            assert got["rewards_accuracy"] == want["rewards_accuracy"]
            assert got["rewards_margin"] == pytest.approx(want["rewards_margin"], abs=0.005)  # beta 0.1 times those
        else:
            assert got["kl"] == pytest.approx(want["kl"], abs=0.02) and want["kl"] > 0
    assert eager[-1]["loss"] < eager[0]["loss"]
    for got, want in zip(graph_params, eager_params, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value on the host (item, int, bool, float) or make a shape from it, and
    those that bring a value in from the host (a tensor made of Python data; `x[index] = 1`, whose 1 PyTorch makes a
    CPU tensor to copy in): under a CUDA-graph capture each one is an error."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.masked_select.default, torch.ops.aten._unique2.default}
    MADE_ON_THE_HOST = {torch.ops.aten.lift_fresh.default}
    PUTS = {torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS or func in self.MADE_ON_THE_HOST or (func in self.PUTS and args[2].dim() == 0):
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _loss_batch(kind, seq_len):
    from training.data import _pack, collate

    rng = random.Random(0)
    ids = [[rng.randrange(3, 64) for _ in range(rng.randint(2, 12))] for _ in range(8)]
    if kind in ("cpt", "sft"):
        return collate(kind, _pack([(i, list(i)) for i in ids], seq_len, pad_id=0)[:2], 0)
    if kind == "dpo":
        batch = collate(kind, [{"chosen": (ids[0], ids[1]), "rejected": (ids[0], ids[2])},
                               {"chosen": (ids[3], ids[4]), "rejected": (ids[3], ids[5])}], 0, seq_len)
        return {**batch, "ref_logps": torch.full((4,), -30.0)}
    batch = collate(kind, [{"pair": (ids[2 * i], ids[2 * i + 1]), "desirable": i != 1} for i in range(3)], 0, seq_len)
    return {**batch, "ref_logps": torch.full((3,), -30.0)}


@interpreted
@pytest.mark.parametrize("kind", sorted(GRAPH_SAFE))
def test_the_captured_losses_read_no_device_value_on_the_host(kind, tiny_model, monkeypatch):
    """Loss and backward of each captured phase kind, with the experts on the GPU's Triton path (interpreted) and
    transformers building the padded attention mask as it does under a capture: nothing is read on the host."""
    from training import moe_lora
    from training.lora import attach_lora, randomize_routed_lora_b
    from training.losses import LOSSES

    model = attach_lora(tiny_model, r=4, alpha=8)
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    moe_lora.kernels_of(model).path = "triton"
    phase = {"kind": kind, "beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0}
    batch = _loss_batch(kind, 64)
    # What transformers asks to know it is being captured (eagerly it reads the mask to see if it may skip it).
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    reads = _HostReads()
    with reads:
        loss, stats = LOSSES[kind](model, batch, phase, {})
        loss.backward()
    assert reads.seen == []
    assert moe_lora.kernels_of(model).last_path == "triton"
    assert all(torch.is_tensor(v) or v in (True, batch["input_ids"].numel()) for v in stats.values())


@interpreted
@pytest.mark.parametrize("kind", ["cpt", "sft"])
def test_a_deltanet_familys_packed_micro_step_reads_nothing_on_the_host(kind, monkeypatch):
    """Qwen3.5-MoE on packed rows with the GPU's path (the fused norms, the one-pass DeltaNet layer on our short
    convolution's kernel: the interpreter plays the GPU; transformers' PyTorch rule stands in for FLA's): the loss
    and backward neither read a value on the host nor bring one in from it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training import linear_attention, norms
    from training.examples.tiny import TINY_QWEN3_5_CONFIG
    from training.lora import attach_lora
    from training.losses import LOSSES

    for module in (linear_attention, norms):
        monkeypatch.setattr(module, "KERNEL_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(linear_attention, "fla_chunk_rule", lambda: linear_attention.torch_chunk_rule)
    fields = dict(TINY_QWEN3_5_CONFIG)
    torch.manual_seed(0)
    model = attach_lora(AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)),
                        r=4, alpha=8)
    one_pass = linear_attention.device_packed_forward
    calls = []
    monkeypatch.setattr(linear_attention, "device_packed_forward", lambda *args: calls.append(1) or one_pass(*args))
    batch = _loss_batch(kind, 64)
    LOSSES[kind](model, batch, {"kind": kind}, {})  # as the trainer's eager warm-ups: the norms settle what they keep
    assert len(calls) == model.config.layer_types.count("linear_attention") > 0  # each DeltaNet layer: the one pass
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    reads = _HostReads()
    with reads:
        loss, _ = LOSSES[kind](model, batch, {"kind": kind}, {})
        loss.backward()
    assert reads.seen == []
    assert torch.isfinite(loss)


def test_a_preference_data_set_of_varied_lengths_takes_no_more_shapes_than_there_are_buckets(tmp_path):
    from training.data import ByteTokenizer, batch_indices, collate, length_buckets, load_phase_data

    rng = random.Random(0)

    def words(low, high):
        return " ".join("w" * rng.randint(1, 6) for _ in range(rng.randint(low, high)))

    path = tmp_path / "dpo.jsonl"
    path.write_text("".join(json.dumps({"prompt": words(1, 300), "chosen": words(1, 80), "rejected": words(1, 80)})
                            + "\n" for _ in range(200)))
    tokenizer, seq_len, batch_size = ByteTokenizer(260), 2048, 4
    items = load_phase_data("dpo", path, tokenizer, seq_len)

    def signatures(bucketed):
        keys = set()
        for position in range(100):
            index = batch_indices(len(items), batch_size, position, seed=0)
            batch = collate("dpo", [items[i] for i in index], tokenizer.pad_token_id, seq_len if bucketed else None)
            keys.add(_signature({**batch, "ref_logps": torch.zeros(2 * batch_size)}, "dpo", 0.5))
        return keys

    assert 1 < len(signatures(bucketed=True)) <= len(length_buckets(seq_len))
    assert len(signatures(bucketed=False)) > 4 * len(length_buckets(seq_len))  # what a graph per shape would face


@gpu
def test_replayed_packed_micro_steps_of_a_deltanet_family_train_like_eager_ones():
    """Qwen3.5-MoE (Gated DeltaNet and attention) on the trainer's packed rows: the DeltaNet layers read the rows'
    device boundaries, so the micro-steps are captured and replayed; same losses and adapter as eager."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.data import _pack, collate
    from training.examples.tiny import TINY_QWEN3_5_CONFIG
    from training.packing import with_host_ends

    fields = {**TINY_QWEN3_5_CONFIG, "linear_key_head_dim": 32, "linear_value_head_dim": 32}  # FLA's smallest tiles
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    base = base.to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 200, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 40, (48,), generator=gen)]
    rows = _pack([(ids, list(ids)) for ids in samples], 64, pad_id=0)
    batches = [collate("cpt", rows[i:i + 2], pad_id=0, width=32) for i in range(0, 8, 2)]

    def micro(model):  # as the trainer makes them for this model (no host value where its attention has the rows)
        return [{k: v.to("cuda") for k, v in with_host_ends(model, dict(b)).items()} for b in batches]

    eager_losses, eager_params, _ = _three_cpt_steps(base, micro, False)
    graph_losses, graph_params, graphs = _three_cpt_steps(base, micro, True)
    assert graphs.replaying and not graphs.failed
    assert graph_losses == pytest.approx(eager_losses, rel=1e-3)
    for got, want in zip(graph_params, eager_params, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


def _three_cpt_steps(base, micro_for, use_graphs):
    """Three optimizer steps of CPT on a copy of `base` with the trainer's LoRA, eagerly or with graphs (two eager
    warm-ups, the capture, replays, in-place zeroing): (losses, trainable parameters after, the graphs)."""
    from training import moe_lora
    from training.distributed import OneRank
    from training.graphs import MicroStepGraphs
    from training.lora import attach_lora, randomize_routed_lora_b
    from training.losses import causal_lm_loss
    from training.phase import PhaseLoss, Trainee, lr_lambda
    from training.train import parameter_groups

    torch.manual_seed(1)  # peft draws lora_A from the global generator: the same adapter both times
    model = attach_lora(copy.deepcopy(base), r=4, alpha=8)
    randomize_routed_lora_b(model, generator=torch.Generator().manual_seed(1))
    micro = micro_for(model)
    groups = parameter_groups(model)
    optimizer = torch.optim.AdamW(groups["trainable"], lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 10, 1.0))
    graphs = MicroStepGraphs(groups["trainable"]) if use_graphs else None
    ctx, phase = {"device": torch.device("cuda")}, {"kind": "cpt"}
    # As the trainer runs graphs: routed LoRA gradients added into .grad by the kernels; eager: plain autograd.
    with moe_lora.grads_accumulated_in_place(model) if use_graphs else contextlib.nullcontext():
        trainee = Trainee(model, groups, OneRank(torch.device("cuda")), graphs, max_grad_norm=1.0)
        losses = [trainee.optimizer_step(micro, PhaseLoss(causal_lm_loss, phase, ctx), optimizer,
                                         scheduler)["loss"] for _ in range(3)]
    return losses, [p.detach().float().clone() for p in groups["trainable"]], graphs
