"""Tiny random Qwen3-MoE and Qwen3.5-MoE recipes over the example data, built in code (tests, quick checks)."""

from pathlib import Path

from training.recipe import validate

HERE = Path(__file__).parent
TINY_CONFIG = {
    "model_type": "qwen3_moe", "vocab_size": 260, "hidden_size": 32, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "num_experts": 6, "num_experts_per_tok": 2, "max_position_embeddings": 256,
}
# Qwen3.5/3.6-MoE text shape in miniature: 3 Gated DeltaNet layers then 1 full-attention layer, a shared expert.
TINY_QWEN3_5_CONFIG = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 260, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "linear_num_value_heads": 4,
    "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4, "max_position_embeddings": 256,
}
PHASES = {
    "cpt": {"kind": "cpt", "data": str(HERE / "cpt.jsonl")},
    "sft": {"kind": "sft", "data": str(HERE / "sft.jsonl")},
    "dpo": {"kind": "dpo", "data": str(HERE / "dpo.jsonl")},
    "kto": {"kind": "kto", "data": str(HERE / "kto.jsonl")},
    "grpo": {"kind": "grpo", "data": str(HERE / "grpo.jsonl"), "reward": "training.examples.rewards:answer_characters",
             "num_generations": 4, "max_new_tokens": 8},
}


def tiny_recipe(work_dir, phases=(("cpt", 3),), config=None, **settings):
    """A validated recipe: phases as (kind, steps) pairs, everything the run writes under work_dir; config: the
    model's (default TINY_CONFIG)."""
    work_dir = Path(work_dir)
    raw = {
        "model": {"config": dict(config or TINY_CONFIG), "dtype": "float32"},
        "lora": {"r": 4, "alpha": 8},
        "batch_size": 2, "grad_accum": 2, "seq_len": 64, "lr": 1.0e-3,
        "checkpoint": {"store": str(work_dir / "checkpoints"), "staging": str(work_dir / "staging"), "every": 2},
        "metrics": {"jsonl": str(work_dir / "metrics.jsonl")},
        "phases": [{**PHASES[kind], "steps": steps} for kind, steps in phases],
    }
    for key, value in settings.items():
        raw[key] = {**raw[key], **value} if isinstance(raw.get(key), dict) else value
    return validate(raw, base_dir=work_dir)
