"""CUDA-graph micro-steps: what is captured, and (on a GPU) that replaying trains exactly as eager steps do."""

import contextlib
import copy
import os

import pytest
import torch

from training.graphs import _signature

gpu = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                         reason="CUDA graphs need a GPU (run with TRITON_INTERPRET=0)")


def test_only_fixed_shape_tensor_batches_of_sync_free_losses_are_captured():
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    key = _signature(batch, "sft", 0.125)
    assert key == _signature({k: v.clone() for k, v in batch.items()}, "sft", 0.125)
    assert key != _signature({k: v[:, :4] for k, v in batch.items()}, "sft", 0.125)  # another shape
    assert key != _signature(batch, "sft", 0.25)  # another accumulation count
    assert _signature({"prompts": [[1, 2]], "records": [{}]}, "grpo", 1.0) is None  # host lists: never captured


@gpu
def test_replayed_micro_steps_train_like_eager_ones(tiny_config):
    """Three optimizer steps of four micro-batches: eager, then with graphs (two eager warm-ups, the capture, and
    replays across steps, with in-place zeroing in between, gradients added in place by the experts' kernels). Same
    losses, same adapter."""
    from transformers import Qwen3MoeForCausalLM

    from training import moe_lora
    from training.graphs import MicroStepGraphs
    from training.lora import attach_lora, randomize_routed_lora_b
    from training.losses import causal_lm_loss
    from training.train import lr_lambda, optimizer_step, parameter_groups

    torch.manual_seed(0)
    base = Qwen3MoeForCausalLM(tiny_config).to("cuda", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = [{"input_ids": ids, "labels": ids}
               for ids in torch.randint(0, 64, (4, 2, 16), device="cuda", generator=gen)]
    ctx, phase = {"device": torch.device("cuda")}, {"kind": "cpt"}

    def train(use_graphs):
        torch.manual_seed(1)  # peft draws lora_A from the global generator: the same adapter both times
        model = attach_lora(copy.deepcopy(base), r=4, alpha=8)
        randomize_routed_lora_b(model, generator=torch.Generator().manual_seed(1))
        groups = parameter_groups(model)
        optimizer = torch.optim.AdamW(groups["trainable"], lr=1e-3, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 10, 1.0))
        graphs = MicroStepGraphs(groups["trainable"]) if use_graphs else None
        # As the trainer runs graphs: routed LoRA gradients added into .grad by the kernels; eager: plain autograd.
        with moe_lora.grads_accumulated_in_place(model) if use_graphs else contextlib.nullcontext():
            losses = [optimizer_step(model, batches, causal_lm_loss, phase, ctx, optimizer, scheduler, groups, 1.0,
                                     graphs=graphs)["loss"] for _ in range(3)]
        return losses, [p.detach().float().clone() for p in groups["trainable"]], graphs

    eager_losses, eager_params, _ = train(False)
    graph_losses, graph_params, graphs = train(True)
    assert graphs.replaying
    assert graph_losses == pytest.approx(eager_losses, rel=1e-3)
    assert eager_losses[-1] < eager_losses[0]
    for got, want in zip(graph_params, eager_params):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
