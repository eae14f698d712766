"""The `vllm serve` line of a serving box's start script and the shell lines before it that pick its GPUs, on the
standard library alone, so that bench/serve_check.py starts vLLM exactly as a box does (docs/fleet.md,
"fleet/inference/adapters.py")."""

import shlex

# The box's GPUs as vLLM's tensor-parallel size ($tp): a model ranked onto a box of several GPUs because one card
# cannot hold it would not load on one. The largest power of two of them, so that it divides the heads.
TENSOR_PARALLEL = (
    "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)",
    'tp=1; while [ $((tp * 2)) -le "${gpus:-0}" ]; do tp=$((tp * 2)); done',
)


def serve_command(base: str, revision: str, port, name: str) -> str:
    """vLLM in the background, logging to $root/vllm.log, serving the adapter in $adapter as `name` at the rank
    $rank the fetch program printed, over $tp GPUs."""
    # The hub revision the adapter was trained on: without it vLLM loads the hub's default branch of today.
    revision = f" --revision {shlex.quote(revision)}" if revision else ""
    return (f"nohup vllm serve {shlex.quote(base)}{revision} --host 0.0.0.0 --port {port} --enable-lora "
            f"--max-lora-rank \"$rank\" --tensor-parallel-size \"$tp\" "
            f"--lora-modules {shlex.quote(name)}=\"$adapter\" >> \"$root/vllm.log\" 2>&1 &")
