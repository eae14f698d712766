"""A 4-layer Qwen3-30B-A3B-shaped run (random bf16 weights) of the trainer on the example CPT and SFT data, then the
last phase's final adapter exported by hand in peft's format and for vLLM; prints what each checkpoint holds and the
exports' keys (JSON last line). On a GPU:

    python bench/train_and_export.py OUT_FOLDER
    python bench/train_and_export.py --smoke [OUT_FOLDER]   (on a CPU: the tiny model in float32, 2 steps a phase;
        fails unless the run and both exports succeed)
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from safetensors.torch import load_file

root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root))
from training.examples.tiny import TINY_CONFIG  # noqa: E402

ex = root / "training" / "examples"
MODEL = {"config": {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                    "moe_intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 32,
                    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                    "norm_topk_prob": True, "max_position_embeddings": 4096}, "dtype": "bfloat16"}
SIZES = {"lora": {"r": 32, "alpha": 64}, "batch_size": 2, "grad_accum": 2, "seq_len": 1024, "steps": 8, "every": 4}
SMOKE_SIZES = {"lora": {"r": 4, "alpha": 8}, "batch_size": 1, "grad_accum": 1, "seq_len": 128, "steps": 2, "every": 2}


def recipe_for(out: Path, smoke: bool) -> dict:
    model, sizes = ({"config": dict(TINY_CONFIG), "dtype": "float32"}, SMOKE_SIZES) if smoke else (MODEL, SIZES)
    return {
        "model": model, "lora": sizes["lora"], "batch_size": sizes["batch_size"], "grad_accum": sizes["grad_accum"],
        "seq_len": sizes["seq_len"], "lr": 2e-4,
        "checkpoint": {"store": str(out / "store"), "staging": str(out / "staging"), "every": sizes["every"],
                       "keep": 2},
        "metrics": {"jsonl": str(out / "metrics.jsonl")},
        "phases": [{"kind": "cpt", "data": str(ex / "cpt.jsonl"), "steps": sizes["steps"]},
                   {"kind": "sft", "data": str(ex / "sft.jsonl"), "steps": sizes["steps"]}],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the folder to write (with --smoke: a temporary one if left out)")
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU, 2 steps a phase")
    args = parser.parse_args()
    if args.out:
        return run(Path(args.out), args.smoke)
    if not args.smoke:
        parser.error("OUT_FOLDER is needed")
    with tempfile.TemporaryDirectory(prefix="train-and-export-") as out:
        return run(Path(out), args.smoke)


def run(out: Path, smoke: bool) -> int:
    """Trains, exports and reports into `out`; 1 if the run or an export failed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe_for(out, smoke)))
    t = time.time()
    done = subprocess.run([sys.executable, "-m", "training.train", "--recipe", str(out / "recipe.yaml")], cwd=root,
                          capture_output=True, text=True)
    print(done.stdout[-3000:], done.stderr[-2000:])
    result = {"train_rc": done.returncode, "train_s": round(time.time() - t, 1)}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result["steps"] = len(lines)
    result["last"] = {k: lines[-1].get(k) for k in ("phase", "step", "loss", "step_s", "tokens_per_s", "kernel_path",
                                                     "grad_norm_routed")}
    finals = sorted(p.name for p in (out / "store").iterdir())
    result["store"] = finals
    for name in finals:
        folder = out / "store" / name
        result[name] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    final = out / "store" / finals[-1]
    for fmt in ("peft", "vllm"):
        r = subprocess.run([sys.executable, "-m", "training.export_adapter", "--format", fmt, "--adapter", str(final),
                            "--out", str(out / f"export-{fmt}")], cwd=root, capture_output=True, text=True)
        result[f"export_{fmt}"] = {"rc": r.returncode, "tail": (r.stdout + r.stderr)[-400:],
                                   "files": sorted(p.name for p in (out / f"export-{fmt}").glob("*"))}
    # The 2-D layout names each expert's projections on their own.
    v = load_file(str(out / "export-vllm" / "adapter_model.safetensors"))
    p = load_file(str(final / "adapter" / "adapter_model.safetensors"))
    keys = [k for k in v if ".layers.0." in k and ".experts.5.down_proj" in k]
    result["vllm_keys_layer0_expert5_down"] = keys
    result["vllm_key_count"], result["peft_key_count"] = len(v), len(p)
    print(json.dumps(result))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return int(any(rc != 0 for rc in (result["train_rc"], result["export_peft"]["rc"], result["export_vllm"]["rc"])))


if __name__ == "__main__":
    sys.exit(main())
