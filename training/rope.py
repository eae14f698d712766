"""The model's rotary position embeddings on the fused Triton kernels (training/kernels/rope.py), where they apply
(docs/training.md, "training/rope.py")."""

import functools
import inspect
import sys

ROTATE_HALF_MODULES = (
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "transformers.models.qwen2_moe.modeling_qwen2_moe",
    "transformers.models.qwen3.modeling_qwen3",
)
FUNCTION_NAME = "apply_rotary_pos_emb"


def _fused(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        from training.kernels.rope import rotary_embedding, supported

        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[0] if args else 1)
        others = len(args) > 1 or any(key != "unsqueeze_dim" for key in kwargs)
        if others or unsqueeze_dim != 1 or not q.is_cuda or not cos.is_cuda or not supported(q, k, cos, sin):
            return original(q, k, cos, sin, *args, **kwargs)
        return rotary_embedding(q, k, cos, sin)

    apply_rotary_pos_emb.fused_rope = True
    return apply_rotary_pos_emb


def use_fused_rope(model) -> int:
    """Replace the rotary embedding of every listed family this model's attention uses; returns how many attention
    layers now call the fused one."""
    layers = 0
    for module in model.modules():
        cls = type(module)
        home = sys.modules.get(cls.__module__)
        forward = getattr(cls, "forward", None)
        code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None
        if home is None or home.__name__ not in ROTATE_HALF_MODULES or code is None:
            continue
        if FUNCTION_NAME not in code.co_names or not callable(getattr(home, FUNCTION_NAME, None)):
            continue
        if not getattr(getattr(home, FUNCTION_NAME), "fused_rope", False):
            setattr(home, FUNCTION_NAME, _fused(getattr(home, FUNCTION_NAME)))
        layers += 1
    return layers


def restore_original_rope() -> int:
    """Put transformers' own function back in every listed module (the benchmark's off-the-shelf baseline runs in the
    same process as ours); returns how many modules changed."""
    restored = 0
    for name in ROTATE_HALF_MODULES:
        home = sys.modules.get(name)
        current = getattr(home, FUNCTION_NAME, None) if home is not None else None
        if current is not None and getattr(current, "fused_rope", False):
            setattr(home, FUNCTION_NAME, current.__wrapped__)
            restored += 1
    return restored
