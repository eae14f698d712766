"""Every benchmark's `--smoke` run, as a person would start it (`python bench/X.py --smoke`), so that a change that
breaks a benchmark fails here: it must exit 0 and print its figures. The database benchmarks make their own
throwaway databases on the tests' PostgreSQL; the GPU benchmarks run tiny shapes on the CPU."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A benchmark's last line is one JSON object: the keys each smoke run must print.
FIGURES = {
    "deltanet_packed": {"path", "samples", "tokens", "fast_equal_within_bf16", "device_equal_within_bf16", "fast_ms",
                        "device_ms", "per_sample_ms",
                        "fast_vs_per_sample_output", "fast_vs_per_sample_input_grad"},
    "chaos": {"scenarios", "kinds", "orphaned_boxes", "double_rents", "lost_offers", "hostile_posts_accepted",
              "healthy_boxes_shed_beyond_cap", "serving_boxes_billing_past_window",
              "checkpoints_refused_by_successors", "honest_completes_refused", "errors"},
    "grpo_scoring": {"row_logps_max_rel_diff", "tokens_equal", "lora_grad_rel_diff", "ms_packed_unmasked",
                     "ms_sdpa_masked"},
    "hopper_compile": {"triton", "target", "rows", "compiled", "all_fit", "dense", "dense_compiled"},
    "hopper_ws": {"max_rel_err", "timed", "rows"},
    "ingest": {"points", "points_per_s", "batch_p50_ms"},
    "memory_table": {"rows", "measured"},
    "moe_block": {"rows", "gemm", "sonic"},
    "moe_gemms": {"configs", "block"},
    "optimizer_convergence": {"device", "steps", "seeds", "noise", "results", "all_within_noise"},
    "optimizer_step": {"device", "tensors", "factors", "results"},
    "probes": {"round_s", "ok", "failed", "misjudged", "queries"},
    "ranking": {"median_ms", "p95_ms", "passed", "all_pass_median_ms", "all_pass_ranked"},
    "reaper": {"median_ms", "queries", "constant_queries"},
    "recovery": {"noticed_s", "first_step_s", "resumed_phase", "resumed_step"},
    "rollout": {"transformers_tokens_per_second", "ours_tokens_per_second", "speedup", "eval_tokens_per_second"},
    "saved_activations": {"model", "tokens", "hidden", "rows"},
    "run_page": {"page_p95_ms", "data_p95_ms", "data_cold_p95_ms", "list_p95_ms", "largest_trace_points"},
    "serve_check": {"rows", "vllm", "tolerance", "families"},
    "train_and_export": {"train_rc", "steps", "store", "export_peft", "export_vllm", "vllm_key_count"},
    "train_step": {"model", "results"},
}
# What each smoke run's figures must say beyond their presence.
CHECKS = {
    "chaos": lambda f: f["scenarios"] == f["kinds"] and f["errors"] == 0,  # each scenario once, none failing
    # the packed call (a stand-in here) keeps each of several samples apart: the per-sample answer, in float32
    "deltanet_packed": lambda f: f["samples"] > 3 and f["fast_equal_within_bf16"] and f["device_equal_within_bf16"]
    and f["fast_vs_per_sample_output"] < 1e-5 and f["fast_vs_per_sample_input_grad"] < 1e-5,
    # each product with each epilogue builds for sm_90a on tensor cores and fits its shared memory; only the adding
    # epilogues add atomically
    "hopper_compile": lambda f: f["compiled"] == 11 and f["all_fit"] and all(
        r["wgmma"] > 0 and (r["atomics"] > 0) == (r["epilogue"] in ("scatter", "gated")) for r in f["rows"])
    and f["dense_compiled"] == len(f["dense"]) == 13,  # and every dense kernel builds
    "hopper_ws": lambda f: f["timed"] is False,
    "ingest": lambda f: f["points"] == 4000,
    # each family in each budget ran and said its plan and its reserve beside the prediction
    "memory_table": lambda f: f["measured"] == 4 and all(
        r["plan"] and r["predicted_gib"] > 0 and r["tokens_per_second"] > 0 for r in f["rows"]),
    "probes": lambda f: f["misjudged"] == 0 and f["ok"] + f["failed"] == 20,
    "reaper": lambda f: f["constant_queries"],
    # the fused norms keep less in every kind of layer; the remade convolution less in the DeltaNet ones
    "saved_activations": lambda f: len(f["rows"]) == 4 and all(
        f["rows"][1][kind] < f["rows"][0][kind] for kind in ("full_attention", "linear_attention"))
    and f["rows"][3]["linear_attention"] < f["rows"][2]["linear_attention"],
    # every plan's optimizer ran on the same model and batches; a few steps in they still track float32 AdamW
    "optimizer_convergence": lambda f: set(f["results"]) == {
        "adamw", "adamw_8bit", "adamw_8bit_bf16", "adamw_offload_bf16"} and f["all_within_noise"],
    # ours steps as AdamW does up to its 8-bit moments: within a few percent of AdamW's own movement
    "optimizer_step": lambda f: f["results"]["ours_8bit"]["max_rel_diff_to_adamw"] < 0.1
    and f["results"]["ours_8bit"]["state_bytes"] < f["results"]["adamw"]["state_bytes"] / 3,
    "rollout": lambda f: f["eval_tokens_per_second"] > 0,
    # Without a GPU and vLLM: both families trained, exported and merged, the merged weights answering as peft
    # within the bf16 tolerance, and unlike the base.
    "serve_check": lambda f: f["vllm"].startswith("skipped") and len(f["rows"]) == 2 and all(
        r["worst_logprob_diff"] <= f["tolerance"] and r["adapter_in_effect"]["served_differs"] > 0
        for r in f["rows"]),
    "train_and_export": lambda f: f["steps"] == 4 and f["export_vllm"]["rc"] == 0,
    # ... and ours counts the router's load as the trainer does: every (token, choice) pair of the step, once ...
    "train_step": lambda f: {r["backend"] for r in f["results"] if not r.get("oom")} == {
        "ours", "ours:eager", "grouped_mm+peft"} and all(
        r["router_every"] == 1 and r["router_counted"] > 0 for r in f["results"] if r["backend"].startswith("ours"))
    # ... and each validates on its held-out rows once, as the trainer does at eval_every 1.
    and all(r["eval_runs"] == 1 and r["eval_rows"] == 2 and r["eval_s"] > 0 for r in f["results"]),
}
# The kernels' own benchmarks run them in Triton's interpreter; the model benchmarks take the torch path a CPU gets.
KERNELS = {"hopper_ws", "moe_block", "moe_gemms"}
SLOW = {"recovery"}  # two simulated boxes start the real agent and trainer, one after the other
WORKERS = min(4, max(2, (os.cpu_count() or 2) // 2))


# bench/ modules that are no benchmark of their own: what the benchmarks import.
HELPERS = {"support", "memory_history"}


def test_every_benchmark_has_a_smoke_test():
    assert {p.stem for p in (ROOT / "bench").glob("*.py")} - HELPERS == set(FIGURES)


def smoke(name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torch's spinning threads on a busy 2-core machine: 30x slower
    if name in KERNELS:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, f"bench/{name}.py", "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=280)


@pytest.fixture(scope="module")
def smoke_runs(request):
    """The selected smoke runs, started at once in the order the tests take them, WORKERS at a time (each is mostly
    one process on one core): the tests then wait for their own."""
    chosen = [item.callspec.params["name"] for item in request.session.items
              if getattr(item, "originalname", "") == "test_smoke_run"]
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        yield {name: pool.submit(smoke, name) for name in chosen}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else [])
                                  for n in sorted(FIGURES)])
def test_smoke_run(name, smoke_runs):
    done = smoke_runs[name].result()
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, said
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert FIGURES[name] <= figures.keys(), said
    assert CHECKS.get(name, lambda f: True)(figures), said
    if name == "hopper_ws":
        assert "the timed part needs an H100 or H200" in done.stdout


def _bench_module(name="memory_table"):
    """bench/NAME.py as a module (the bench folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


GIB = 2**30
LAYER = [_frame("/venv/torch/nn/functional.py", 10, "silu"), _frame("/srv/app/training/moe_lora.py", 120, "forward")]
TUNER = [_frame("/venv/torch/_tensor.py", 5, "clone"), _frame("/venv/triton/testing.py", 80, "do_bench")]


def test_the_first_steps_peak_is_charged_to_the_code_whose_blocks_were_alive_then():
    """bench/train_step.py --memory-history: at the reserve's peak, the blocks still alive summed by their owner (the
    innermost project frame, else the innermost outside torch); blocks freed before the peak are not counted, and the
    reserve no block used is reported as cached."""
    summary = _bench_module("memory_history").summary
    events = [
        {"action": "segment_map", "addr": 0, "size": 4 * GIB},
        {"action": "alloc", "addr": 1, "size": 1 * GIB, "frames": LAYER},
        {"action": "alloc", "addr": 2, "size": 1 * GIB, "frames": LAYER},
        {"action": "alloc", "addr": 3, "size": GIB // 2, "frames": TUNER},
        {"action": "free_requested", "addr": 3, "size": GIB // 2},
        {"action": "free_completed", "addr": 3, "size": GIB // 2},  # the tuner's buffer is gone before the peak
        {"action": "segment_map", "addr": 9, "size": 2 * GIB},  # the peak: 10 GiB reserved
        {"action": "alloc", "addr": 4, "size": GIB // 4, "frames": TUNER},
        {"action": "segment_unmap", "addr": 9, "size": 2 * GIB},
        {"action": "alloc", "addr": 5, "size": 3 * GIB, "frames": LAYER},  # after the peak: not counted
    ]
    got = summary(events, reserved_before=4 * GIB, allocated_before=3 * GIB)
    assert got["peak_reserved_gib"] == 10.0 and got["peak_at_event"] == 6
    assert got["allocated_before_gib"] == 3.0 and got["allocated_since_gib"] == 2.0
    assert got["cached_unused_gib"] == 5.0
    assert got["largest"] == [{"owner": "training/moe_lora.py:120 forward", "gib": 2.0, "blocks": 2}]


def test_a_block_with_no_project_frame_goes_to_its_innermost_frame_outside_torch():
    owner = _bench_module("memory_history").owner
    assert owner(TUNER) == "/venv/triton/testing.py:80 do_bench"
    assert owner([_frame("/venv/torch/_tensor.py", 5, "clone")]) == "unknown"
    assert owner(None) == "unknown"


def test_the_memory_tables_prediction_takes_the_whole_cards_figure_from_an_earlier_call(tmp_path):
    """A lease measures a budget a call, each into the same --out: a 96 GiB row's predicted tokens/s needs the whole
    card's figure, which an earlier call wrote there."""
    table = _bench_module()
    out = tmp_path / "table.jsonl"
    out.write_text(json.dumps({"model": "35b", "budget_gib": "whole", "tokens_per_second": 17_520}) + "\n"
                   + "a line cut short by a lease's end {\n"
                   + json.dumps({"model": "35b", "budget_gib": "80", "error": "no result within 570 s"}) + "\n")
    rows = [{"model": "35b", "budget_gib": "96", "speed": 0.853, "tokens_per_second": 14_944},
            {"model": "30b", "budget_gib": "80", "speed": 0.83, "tokens_per_second": 18_850}]
    table.with_predictions(rows, table.earlier_rows(out))
    assert rows[0]["predicted_tokens_per_second"] == round(17_520 * 0.853)
    assert "predicted_tokens_per_second" not in rows[1]  # no whole-card figure for 30B, here or earlier
    assert table.earlier_rows(tmp_path / "none yet.jsonl") == []


def test_the_memory_tables_row_for_a_crash_says_the_crashs_own_last_words(tmp_path, monkeypatch):
    """A budget whose run crashed (not out of memory as the benchmark reports it) says the traceback's last line,
    not the last line the run printed before it (its memory plan, which said nothing of why)."""
    table = _bench_module()
    crash = "print('memory plan: checkpointing, 74.5 of 78.6 GiB'); raise RuntimeError('Triton Error [CUDA]: boom')"
    monkeypatch.setattr(table, "command", lambda model, budget, args: [sys.executable, "-c", crash])
    row = table.measured("35b", "whole", argparse.Namespace(limit_s=60))
    assert row["error"] == "exit 1: RuntimeError: Triton Error [CUDA]: boom"
