"""vLLM on a GPU serves the trainer's exported adapters as transformers + peft computes them (bench/serve_check.py at
its smoke size): every layout of both tiny families, and the OpenAI server started by the serving box's own line."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                                reason="needs a CUDA GPU and vLLM")


def test_vllm_answers_with_every_exported_layout_as_peft_does(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "bench/serve_check.py", "--smoke", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    said = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, said
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {(r["family"], r["layout"]): r for r in figures["rows"]}
    for family in ("qwen3_moe", "qwen3_5_moe"):
        for layout in ("vllm", "merged"):
            row = rows[family, layout]
            assert "error" not in row, said
            positions = row["prompts"] * figures["new_tokens"]
            assert row["argmax_mismatches"] <= 0.02 * positions, said  # bf16: a few greedy choices may flip
            assert row["worst_logprob_diff"] <= figures["tolerance"], said
            effect = row["adapter_in_effect"]
            assert effect["served_differs"] > 0 and effect["peft_differs"] > 0, said
    server = figures["server"]
    assert "error" not in server and ["tiny-adapter", server["models"][0][0]] in server["models"], said
    assert server["worst_logprob_diff"] <= figures["tolerance"], said
