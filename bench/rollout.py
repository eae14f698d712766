"""Rollout benchmark on one GPU: GRPO's sampler (training/rollout.py: a static KV cache, each decode step replayed
from a CUDA graph) against transformers' `generate` (its dynamic cache, every step enqueued from Python), on the
same model in the same run.

Random bf16 weights in qwen3-30b-a3b's shape (bench/train_step.py's MODELS; --layers 48 by default), LoRA r=32
alpha=64 attached as the trainer attaches it; 16 prompts of 96 to 128 random tokens, left-padded; 256 new tokens at
temperature 1, every row to the full length (the model, built from a config, has no eos, and none is passed; the
lengths are checked). One warm-up rollout each (ours captures its graph in it), then 2 timed. Prints the tokens/s
of each (new tokens over wall time), the speed-up, and last one JSON line. Then the eval phase's generator
(training/evaluation/generate.py, greedy) on the same prompts, with the adapter and with it off, as that phase
answers each batch: eval_tokens_per_second counts both answers over both calls' time.

    python bench/rollout.py [--layers 48] [--batch 16] [--prompt-tokens 128] [--new-tokens 256]
    python bench/rollout.py --device cpu    (on the CPU: the tiny model, 4 prompts, 16 new tokens, eager)
    python bench/rollout.py --smoke    (the same, one timed rollout each: a check that it runs)
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.train_step import MODELS
from training import rollout
from training.evaluation.generate import Timed, TransformersGenerator
from training.examples.tiny import TINY_CONFIG
from training.lora import attach_lora
from training.recipe import ModelSettings
from training.train import build_model

PAD = 0


def prompts(rows, width, vocab, device):
    """Left-padded random prompts, their lengths spread over the last quarter below `width`."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(width - width // 4, width + 1, (rows,), generator=generator)
    lengths[0] = width
    ids = torch.full((rows, width), PAD)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        ids[row, width - n:] = torch.randint(1, vocab, (n,), generator=generator)
        mask[row, width - n:] = 1
    return ids.to(device), mask.to(device)


def timed(fn, runs, device):
    """fn's last output and the wall seconds of each of `runs` calls after one warm-up call."""
    fn()
    seconds = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return out, seconds


class IdsOnly:
    """The tokenizer the eval generator reads on a random model: ids in, no text out (no eos: every answer runs to
    its full length)."""

    pad_token_id, eos_token_id = PAD, None

    @staticmethod
    def decode(tokens, skip_special_tokens=False):
        return ""


def eval_generation(model, ids, mask, new_tokens, runs, device):
    """The eval phase's tokens/s: each timed run answers every prompt with the adapter, then with it off."""
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    generator = TransformersGenerator(model, IdsOnly(), device)

    def both():
        timer = Timed(generator)
        for adapter in (True, False):
            answers = timer.generate(prompts, new_tokens, adapter=adapter)
            assert all(n == new_tokens for _, n in answers), "an eval answer stopped early"
        return timer

    both()  # warm-up: each way captures its decode step
    timers = [both() for _ in range(runs)]
    generator.close()
    return round(sum(t.tokens for t in timers) / sum(t.seconds for t in timers))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, help="default: the model's own (48)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="the CPU run, one timed rollout each")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.runs = "cpu", 1
    device = torch.device(args.device)
    if device.type == "cpu":  # the smoke run
        config, layers, dtype = dict(TINY_CONFIG), TINY_CONFIG["num_hidden_layers"], "float32"
        args.batch, args.prompt_tokens, args.new_tokens = 4, 16, 16
    else:
        config, layers = MODELS[args.model]
        config, dtype = dict(config), "bfloat16"
    layers = args.layers or layers
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, model {args.model if device.type == 'cuda' else 'tiny'}, "
          f"{layers} layers", flush=True)
    base = build_model(ModelSettings(config={**config, "num_hidden_layers": layers}, dtype=dtype), device)
    model = attach_lora(base, r=32, alpha=64)
    model.eval()
    ids, mask = prompts(args.batch, args.prompt_tokens, config["vocab_size"], device)
    new_tokens = args.batch * args.new_tokens

    def theirs():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=args.new_tokens, pad_token_id=PAD, eos_token_id=None)
        assert out.shape[1] - ids.shape[1] == args.new_tokens, "transformers' generate stopped early"
        return out

    def ours():
        return rollout.sample(model, ids, mask, args.new_tokens, 1.0, None, PAD)

    results = {}
    for label, fn in (("transformers", theirs), ("ours", ours)):
        _, seconds = timed(fn, args.runs, device)
        mean = sum(seconds) / len(seconds)
        results[label] = {"seconds": [round(s, 3) for s in seconds], "tokens_per_second": round(new_tokens / mean),
                          "ms_per_step": round(1000 * mean / args.new_tokens, 2)}
        print(f"{label}: {results[label]['tokens_per_second']:,} tokens/s, {results[label]['ms_per_step']} ms a "
              f"step ({args.batch} rows), runs {results[label]['seconds']} s", flush=True)
    decoders = base.__dict__.get(rollout.DECODERS_ATTRIBUTE, {})
    speedup = round(results["ours"]["tokens_per_second"] / results["transformers"]["tokens_per_second"], 2)
    print(f"speed-up {speedup}x", flush=True)
    graphed = any(d.graph is not None for d in decoders.values())  # read before the eval generator releases them
    eval_tps = eval_generation(model, ids, mask, args.new_tokens, args.runs, device)
    print(f"eval phase (greedy, adapter and base answers): {eval_tps:,} tokens/s", flush=True)
    print(json.dumps({
        "model": args.model if device.type == "cuda" else "tiny", "layers": layers, "device": name,
        "batch": args.batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "cuda_graph": graphed,
        "transformers_tokens_per_second": results["transformers"]["tokens_per_second"],
        "ours_tokens_per_second": results["ours"]["tokens_per_second"], "speedup": speedup, "runs": results,
        "eval_tokens_per_second": eval_tps,
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
