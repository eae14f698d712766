"""bench/train_step.py's memory options on the CPU: --memory-plan auto takes the plan the trainer would in the
--memory-budget-gib given (imposed on a GPU only), from the --optimizer up, and says it beside the measured step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(*options):
    done = subprocess.run([sys.executable, "bench/train_step.py", "--smoke", "--backends", "ours:eager", *options],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_plan_in_a_budget_is_the_trainers_and_runs():
    summary = _bench("--memory-plan", "auto", "--memory-budget-gib", "2", "--optimizer", "adamw_8bit")
    (result,) = summary["results"]
    assert summary["memory_budget_gib"] == 2.0 and result["memory_budget_gib"] == 2.0
    plan = result["memory_plan"]
    # The miniature fits 2 GiB without checkpointing; 8-bit moments were asked for, so never float32 ones.
    assert (plan["plan"], plan["fits"], plan["card_gib"]) == ("no checkpointing, 8-bit moments", True, 2.0)
    assert result["optimizer"] == "AdamW8bit" and result["gradient_checkpointing"] is False
    assert result["optimizer_from"] == "training"  # what the trainer builds: ours, training/kernels/adamw8bit.py
    assert result["tokens_per_second"] > 0 and result["loss"] > 0


def test_torchaos_eight_bit_moments_run_in_the_same_step_for_comparison():
    pytest.importorskip("torchao")
    (result,) = _bench("--optimizer", "adamw_8bit", "--eight-bit", "torchao")["results"]
    assert (result["optimizer"], result["optimizer_from"]) == ("AdamW8bit", "torchao")
    assert result["tokens_per_second"] > 0 and result["loss"] > 0 and result["routed_b_zero"] == 0
