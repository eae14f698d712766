"""A 4-layer Qwen3-30B-A3B-shaped run (random bf16 weights) of the trainer on the example CPT and SFT data, then the
last phase's final adapter exported by hand in peft's format and for vLLM; prints what each checkpoint holds and the
exports' keys (JSON last line). On a GPU:

    python bench/train_and_export.py OUT_FOLDER
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from safetensors.torch import load_file

root = Path(__file__).resolve().parents[1]
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
ex = root / "training" / "examples"
recipe = {
    "model": {"config": {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
              "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "norm_topk_prob": True,
              "max_position_embeddings": 4096}, "dtype": "bfloat16"},
    "lora": {"r": 32, "alpha": 64}, "batch_size": 2, "grad_accum": 2, "seq_len": 1024, "lr": 2e-4,
    "checkpoint": {"store": str(out / "store"), "staging": str(out / "staging"), "every": 4, "keep": 2},
    "metrics": {"jsonl": str(out / "metrics.jsonl")},
    "phases": [{"kind": "cpt", "data": str(ex / "cpt.jsonl"), "steps": 8},
               {"kind": "sft", "data": str(ex / "sft.jsonl"), "steps": 8}],
}
(out / "recipe.yaml").write_text(yaml.safe_dump(recipe))
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
(Path(sys.argv[1]) / "result.json").write_text(json.dumps(result, indent=1))
