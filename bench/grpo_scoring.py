"""GRPO's scoring pass (per-token log-probs of left-padded prompt + completion rows, forward and LoRA backward) on
our packed attention without a mask (`training.losses.token_logps(padding="left")`: each row turned so that its
tokens start it) against transformers' sdpa with the attention mask, on the same model and rows.

Prints the largest relative difference of the rows' summed log-probs, whether both count the same tokens, the
relative difference of the LoRA gradients (all of them as one vector), and each path's ms per fwd+bwd (median of
--repeats after one warm-up); then, the model cast to float32 (masked sdpa), each bf16 path's distance from that
reference, which says whether a difference between the two is more than bf16's own. Random bf16 weights of the
30B shape (bench/train_step.py's model), rows of --length tokens whose first 0-299 are padding and, on every other
row, whose last 0-199 are (completions that ended); the first 64 real tokens of a row are its prompt (no labels).
Last line: one JSON object.

    python bench/grpo_scoring.py [--layers 4] [--rows 8] [--length 1024]
    python bench/grpo_scoring.py --layers 1 --experts 8 --rows 2 --length 256   (a CPU run)
    python bench/grpo_scoring.py --smoke   (the tiny model, 2 rows of 256 tokens, float32, one timed repeat; fails
        unless both paths count the same tokens and agree within SMOKE_TOLERANCE)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_step import CONFIG, DEVICE, build
from training.examples.tiny import TINY_CONFIG
from training.losses import token_logps

PROMPT = 64
SMOKE_TOLERANCE = 1e-4  # float32: the two paths' row log-probs and LoRA gradients


def left_padded_rows(rows, length, vocab, generator):
    ids = torch.randint(3, vocab, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.long)
    for i in range(rows):
        mask[i, :int(torch.randint(0, min(300, length // 3), (1,), generator=generator))] = 0
        if i % 2:
            ended = int(torch.randint(0, min(200, length // 4), (1,), generator=generator))
            mask[i, length - ended:] = 0
    labels = ids.masked_fill((mask == 0) | (mask.cumsum(-1) <= PROMPT), -100)
    return ids.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)


def distance(got, want):
    """||got - want|| / ||want||, the tensors of each list taken as one vector."""
    apart = sum((a - b).norm() ** 2 for a, b in zip(got, want, strict=True))
    return apart.sqrt() / sum(b.norm() ** 2 for b in want).sqrt()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, help="fewer routed experts than the model's (a CPU smoke run)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 2 rows of 256 tokens, one repeat")
    args = parser.parse_args()
    base = CONFIG
    if args.smoke:
        base, args.layers, args.rows, args.length, args.repeats = TINY_CONFIG, 2, 2, 256, 1
    config = {**base, **({"num_experts": args.experts} if args.experts else {})}
    model = build("ours", config, args.layers, False)
    lora = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():  # B starts at zero: give both factors gradient
        for p in lora:
            p.add_(torch.randn_like(p) * 0.01)
    generator = torch.Generator().manual_seed(0)
    ids, mask, labels = left_padded_rows(args.rows, args.length, config["vocab_size"], generator)
    weights = torch.randn(args.rows, 1, generator=generator).to(DEVICE)  # the advantages
    packed = model.config._attn_implementation

    def scored(implementation, padding):
        model.config._attn_implementation = implementation
        model.zero_grad(set_to_none=True)
        logps, tokens = token_logps(model, ids, mask, labels, padding=padding)
        (logps * weights).sum().backward()
        return logps.sum(-1).float().detach(), tokens.sum(-1), [p.grad.float() for p in lora]

    def ms(implementation, padding):
        times = []
        for _ in range(args.repeats + 1):
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            scored(implementation, padding)
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        return round(statistics.median(times[1:]) * 1e3, 2)

    ours, theirs = scored(packed, "left"), scored("sdpa", None)
    result = {
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu", "layers": args.layers,
        "rows": args.rows, "length": args.length, "attention": packed,
        "row_logps_max_rel_diff": float(((ours[0] - theirs[0]).abs() / theirs[0].abs()).max()),
        "tokens_equal": bool(torch.equal(ours[1], theirs[1])),
        "lora_grad_rel_diff": float(distance(ours[2], theirs[2])),
        "ms_packed_unmasked": ms(packed, "left"), "ms_sdpa_masked": ms("sdpa", None),
    }
    result["speedup"] = round(result["ms_sdpa_masked"] / result["ms_packed_unmasked"], 2)
    model.float()
    reference = scored("sdpa", None)
    for name, got in (("packed_unmasked", ours), ("sdpa_masked", theirs)):
        result[f"{name}_vs_float32"] = {"row_logps": float(((got[0] - reference[0]).abs() / reference[0].abs()).max()),
                                        "lora_grads": float(distance(got[2], reference[2]))}
    print(f"{packed} without a mask {result['ms_packed_unmasked']} ms, sdpa with it {result['ms_sdpa_masked']} ms "
          f"({result['speedup']}x); row log-probs within {result['row_logps_max_rel_diff']:.1e}, "
          f"LoRA gradients within {result['lora_grad_rel_diff']:.1e}; against float32: "
          f"{result['packed_unmasked_vs_float32']} and {result['sdpa_masked_vs_float32']}")
    print(json.dumps(result))
    if args.smoke and not (result["tokens_equal"] and max(result["row_logps_max_rel_diff"],
                                                          result["lora_grad_rel_diff"]) <= SMOKE_TOLERANCE):
        sys.exit(f"smoke: the two paths disagree beyond {SMOKE_TOLERANCE}")


if __name__ == "__main__":
    main()
