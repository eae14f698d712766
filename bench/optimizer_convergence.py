"""Does training with the memory plans' optimizer state reach the loss float32 AdamW reaches? A small Qwen3-MoE with
the trainer's LoRA (routed experts and attention) learns a fixed Markov chain's text for a few hundred steps through
the trainer's own optimizer step (training/phase.py: clipping, schedule), once per optimizer choice of
training/memory_plan.py and seed. The noise is float32 AdamW's own spread over seeds; a choice passes when its mean
final loss (the last tenth of the steps) is within that noise (at least 1%) of float32 AdamW's. JSON last line.

    python bench/optimizer_convergence.py [--steps 300] [--seeds 3] [--device cuda]
    python bench/optimizer_convergence.py --smoke   (a few steps on the CPU, the 8-bit step in Triton's interpreter)

On a CPU, `adamw_offload_bf16` (whose state lives on the host beside a GPU) is its optimizer run where the factors
are: the same arithmetic, nothing moved.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if "--smoke" in sys.argv or not torch.cuda.is_available():  # before Triton is imported: the CPU interprets it
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training import fitting, memory_plan, optimizers
from training.distributed import OneRank
from training.examples.tiny import TINY_CONFIG
from training.lora import attach_lora
from training.losses import causal_lm_loss
from training.phase import PhaseLoss, Trainee, lr_lambda
from training.train import parameter_groups

CHOICES = ("adamw", "adamw_8bit", "adamw_8bit_bf16", "adamw_offload_bf16")
MODEL = {**TINY_CONFIG, "hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 8}


def markov_text(vocab, rows, length, seed=0):
    """`rows` x `length` tokens of a fixed chain: each token followed by one of 4 others (probabilities 0.55, 0.25,
    0.15, 0.05), so the best loss is about 1.1 nats a token, far under a first guess's log(vocab)."""
    gen = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, vocab, (vocab, 4), generator=gen)
    weights = torch.tensor([0.55, 0.25, 0.15, 0.05])
    text = torch.empty(rows, length, dtype=torch.long)
    text[:, 0] = torch.randint(0, vocab, (rows,), generator=gen)
    for t in range(1, length):
        pick = torch.multinomial(weights, rows, replacement=True, generator=gen)
        text[:, t] = successors[text[:, t - 1], pick]
    return text


def optimizer_for(choice, params, device, lr):
    if choice.startswith("adamw_offload") and device.type != "cuda":
        return optimizers.HostAdamW(params, lr=lr)  # see the module's note
    return optimizers.build(choice, params, lr=lr, weight_decay=0.0, device=device)


def train(choice, seed, args, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(MODEL)
    torch.manual_seed(0)  # one base model for every run; the seed draws the adapter and the batches' order
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    base = base.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(seed)
    model = attach_lora(base, r=8, alpha=16)
    fitting.cast_factors(model, choice)
    groups = parameter_groups(model)
    optimizer = optimizer_for(choice, groups["trainable"], device, args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", args.steps // 10, args.steps, 0.1))
    trainee = Trainee(model, groups, OneRank(device), None, max_grad_norm=1.0)
    text = markov_text(MODEL["vocab_size"], 256, args.seq_len).to(device)
    order = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(args.steps):
        rows = torch.randint(0, text.shape[0], (args.accum, args.batch), generator=order)
        micro = [{"input_ids": text[r], "labels": text[r]} for r in rows]
        record = trainee.optimizer_step(micro, PhaseLoss(causal_lm_loss, {"kind": "cpt"}, {"device": device}),
                                        optimizer, scheduler)
        losses.append(record["loss"])
    tail = losses[-max(1, args.steps // 10):]
    found = {"first_loss": round(losses[0], 4), "final_loss": round(statistics.fmean(tail), 4)}
    print(f"{choice} seed {seed}: {found}", flush=True)  # as it comes: a run cut short keeps what it had
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.seeds, args.batch, args.accum, args.seq_len, args.device = 4, 2, 2, 1, 16, "cpu"
    device = torch.device(args.device)
    started = time.perf_counter()
    runs = {choice: [train(choice, seed, args, device) for seed in range(args.seeds)] for choice in CHOICES}
    finals = {choice: [r["final_loss"] for r in found] for choice, found in runs.items()}
    reference = statistics.fmean(finals["adamw"])
    noise = max(0.01 * reference, max(finals["adamw"]) - min(finals["adamw"]))
    results = {}
    for choice, values in finals.items():
        mean = statistics.fmean(values)
        results[choice] = {"words": memory_plan.OPTIMIZER_FIGURES[choice].words, "final_losses": values,
                           "mean_final_loss": round(mean, 4), "first_loss": runs[choice][0]["first_loss"],
                           "gap": round(mean - reference, 4), "within_noise": abs(mean - reference) <= noise}
        print(f"{choice:20s} final {mean:.4f} (seeds {values}), gap {mean - reference:+.4f}", flush=True)
    print(f"float32 AdamW's noise over seeds: {noise:.4f}")
    print(json.dumps({"device": str(device), "steps": args.steps, "seeds": args.seeds, "noise": round(noise, 4),
                      "results": results, "all_within_noise": all(r["within_noise"] for r in results.values()),
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
