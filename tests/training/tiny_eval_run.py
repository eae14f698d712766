"""A tiny run with an eval phase, trained on the CPU in seconds: one short SFT phase, then the example eval file."""

import json
from pathlib import Path

import training
from training.recipe import load_recipe
from training.train import run as train

EXAMPLES = Path(training.__file__).resolve().parent / "examples"
CONFIG = {"model_type": "qwen3_moe", "vocab_size": 260, "hidden_size": 32, "intermediate_size": 64,
          "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "num_experts": 6, "num_experts_per_tok": 2, "max_position_embeddings": 512}


def tiny_eval_recipe(root: Path, **eval_settings) -> dict:
    return {"model": {"config": CONFIG, "dtype": "float32"}, "lora": {"r": 4, "alpha": 8}, "batch_size": 2,
            "grad_accum": 1, "seq_len": 64, "lr": 1e-2, "cuda_graphs": False,
            "checkpoint": {"store": str(root / "store"), "staging": str(root / "staging")},
            "metrics": {"jsonl": str(root / "metrics.jsonl")},
            "phases": [{"kind": "sft", "data": str(EXAMPLES / "sft.jsonl"), "steps": 2},
                       {"kind": "eval", "data": str(EXAMPLES / "eval.jsonl"), "scorer": "contains",
                        "max_new_tokens": 6, "batch_size": 2, **eval_settings}]}


def train_tiny_eval_run(root: Path) -> Path:
    """Trains the tiny run's SFT phase into root/store; the path of its recipe (JSON, as the agent writes it)."""
    path = root / "recipe.json"
    path.write_text(json.dumps(tiny_eval_recipe(root)))
    train(load_recipe(path), out=lambda line: None)
    return path
