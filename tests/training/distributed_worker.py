"""One rank of the distributed tests, started by torchrun (tests/training/test_distributed.py):

    grads OUT.pt          one forward and backward of a tiny Qwen3-MoE on this rank's slice of a batch; rank 0
                          saves every LoRA gradient (gathered) next to a one-process run's on the whole batch;
                          then a guard that fails on the last rank only, run through Ranks.everywhere
    die RANK CALL RECIPE  the trainer on RECIPE, SIGKILLed on rank RANK at its CALL-th micro-step
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from training import distributed, guards, phase, train
from training.lora import attach_lora
from training.recipe import ModelSettings

CONFIG = {
    "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 64,
}


def _model():
    base = train.build_model(ModelSettings(config=CONFIG, dtype="float32"), "cpu")
    model = attach_lora(base, r=4, alpha=8)
    with torch.no_grad():  # B nonzero, so that every A gets a gradient too
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model


def _loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def grads(out):
    ranks = distributed.join(distributed.launched_ranks())
    ids = torch.randint(0, 64, (2 * ranks.size, 12), generator=torch.Generator().manual_seed(1))
    model = ranks.shard(_model())
    _loss(model, ranks.rank_slice(ids)).backward()
    ranks.average_expert_grads()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    got = {n: ranks.full_value(n, p, p.grad) for n, p in trainable}
    sharded = sorted(n for n, p in trainable if hasattr(p, "full_tensor"))
    if ranks.main:
        whole = _model()
        _loss(whole, ids).backward()
        expected = {n: p.grad for n, p in whole.named_parameters() if p.requires_grad}
        torch.save({"got": got, "expected": expected, "fsdp_sharded": sharded, "ranks": ranks.size}, out)
    guard(ranks)
    ranks.leave()


def guard(ranks):
    def check():
        if ranks.rank == ranks.size - 1:
            raise guards.RoutedLoraNoGradient("layer 1 got no gradient here")
        return "passed"

    try:
        ranks.everywhere(check)
    except guards.RoutedLoraNoGradient as exc:
        print(f"rank {ranks.rank} stopped: {exc}", flush=True)


def die(rank, call, recipe):
    calls = [0]
    micro_step = phase.eager_micro_step

    def dying(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call and int(os.environ["RANK"]) == rank:
            os.kill(os.getpid(), signal.SIGKILL)
        return micro_step(*args, **kwargs)

    phase.eager_micro_step = dying
    return train.main(["--recipe", recipe])


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "grads":
        grads(rest[0])
        # Everything is saved and printed, the process group destroyed: leave without the interpreter's teardown, in
        # which gloo's threads once aborted a rank ("terminate called without an active exception") on a loaded
        # machine. The trainer's own exit is checked by the runs through `python -m training.train`.
        sys.stdout.flush()
        os._exit(0)
    else:
        sys.exit(die(int(rest[0]), int(rest[1]), rest[2]))
