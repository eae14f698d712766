"""The eval phase's generation on a GPU (the experts' Triton path, decode steps in CUDA graphs): the adapter's
answers and the base's stay apart however the two alternate, and the base's are what a zero adapter gives."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("eval_generate_gpu_worker.py")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_adapter_on_and_off_keep_their_own_graphs_and_off_is_a_zero_adapter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(WORKER)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["tuned"] != answers["base"]
    assert answers["tuned_again"] == answers["tuned"] and answers["base_again"] == answers["base"]
    assert answers["zero_tuned"] == answers["base"]
    assert answers["graphs"] >= 1
