"""Checkpoints: a run killed with SIGKILL and started again matches an uninterrupted one; a checkpoint without its
completion marker is never used; checkpoints round-trip through a real S3-compatible server (moto) on loopback."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training import checkpoint
from training.examples.tiny import tiny_recipe
from training.recipe import RecipeError
from training.train import run
from training.trainer_exits import STOPPED_EXIT

REPO = Path(__file__).resolve().parents[2]
CASCADE = [("cpt", 8), ("sft", 6), ("dpo", 4), ("kto", 3), ("grpo", 4)]


def _last_by_step(metrics_path):
    records = {}
    for line in open(metrics_path):
        r = json.loads(line)
        records[(r["phase"], r["step"])] = r  # a step redone after a resume replaces the first try
    return records


def _final_adapter(store_dir):
    name = checkpoint.latest_complete(checkpoint.LocalStore(store_dir))
    return name, load_file(Path(store_dir) / name / "adapter" / "adapter_model.safetensors")


def _recipe_file(work_dir):
    raw = {
        "model": {"config": tiny_recipe(work_dir)["model"]["config"], "dtype": "float32"},
        "lora": {"r": 4, "alpha": 8}, "batch_size": 2, "grad_accum": 2, "seq_len": 64, "lr": 1.0e-3,
        "checkpoint": {"store": "checkpoints", "staging": "staging", "every": 3, "keep": 2},
        "metrics": {"jsonl": "metrics.jsonl"},
        "phases": [{k: v for k, v in phase.items() if k != "name" and k != "checkpoint_every" and k != "lr"
                    and v is not None} for phase in tiny_recipe(work_dir, phases=CASCADE)["phases"]],
    }
    path = Path(work_dir) / "recipe.json"
    path.write_text(json.dumps(raw))
    return path


def _train(recipe_path, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "training.train", "--recipe", str(recipe_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def _signal_after(proc, metrics, lines, sig, timeout_s=120):
    """Send `sig` to the trainer once its metrics file holds `lines` steps (or give up when it exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and sum(1 for _ in open(metrics)) >= lines:
            proc.send_signal(sig)
            return
        time.sleep(0.005)


def test_a_run_killed_mid_phase_and_restarted_matches_an_uninterrupted_run(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    reference = _train(_recipe_file(whole))
    victim = _train(_recipe_file(killed))
    metrics = killed / "metrics.jsonl"
    # Kill once the run is well into its second phase (several checkpoints complete, more steps to go).
    _signal_after(victim, metrics, 12, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL, victim.stdout.read()
    done_before = _last_by_step(metrics)
    assert len(done_before) < sum(steps for _, steps in CASCADE)

    resumed = _train(_recipe_file(killed))
    out = resumed.communicate(timeout=180)[0]
    assert resumed.returncode == 0, out
    assert "resuming from checkpoint ckpt-p01" in out or "resuming from checkpoint ckpt-p00" in out
    assert reference.wait(timeout=180) == 0, reference.stdout.read()

    expected, got = _last_by_step(whole / "metrics.jsonl"), _last_by_step(metrics)
    assert sorted(got) == sorted(expected)
    for key, record in expected.items():
        assert got[key]["loss"] == pytest.approx(record["loss"], rel=1e-4, abs=1e-6), key
        assert got[key]["routed_b_norm"] == pytest.approx(record["routed_b_norm"], rel=1e-4), key
    name_a, adapter_a = _final_adapter(whole / "checkpoints")
    name_b, adapter_b = _final_adapter(killed / "checkpoints")
    assert name_a == name_b == checkpoint.checkpoint_name(len(CASCADE) - 1, CASCADE[-1][1])
    for key in adapter_a:
        torch.testing.assert_close(adapter_b[key], adapter_a[key], rtol=1e-4, atol=1e-6)
    # Pruned to the keep count, each phase's final (its adapter) kept whatever its age.
    kept = set(checkpoint.LocalStore(killed / "checkpoints").names())
    finals = {checkpoint.checkpoint_name(i, steps) for i, (_, steps) in enumerate(CASCADE)}
    assert finals <= kept and len(kept - finals) <= 2


def test_a_checkpoint_without_its_marker_is_ignored(tmp_path):
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 4), ("sft", 2)])
    recipe["phases"] = recipe["phases"][:1]
    run(recipe, out=lambda line: None)
    store = checkpoint.LocalStore(tmp_path / "checkpoints")
    assert checkpoint.latest_complete(store) == "ckpt-p00-s00000004"
    # A host died while uploading the next one: its files are there, its marker is not.
    torn = tmp_path / "checkpoints" / "ckpt-p01-s00000002"
    torn.mkdir()
    (torn / "trainer.pt").write_bytes(b"half")
    assert store.names()["ckpt-p01-s00000002"] is False
    assert checkpoint.latest_complete(store) == "ckpt-p00-s00000004"

    lines = []
    run(tiny_recipe(tmp_path, phases=[("cpt", 4), ("sft", 2)]), out=lines.append)
    assert lines[0] == "resuming from checkpoint ckpt-p00-s00000004"
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [(r["kind"], r["step"]) for r in records[4:]] == [("sft", 1), ("sft", 2)]
    assert checkpoint.latest_complete(store) == "ckpt-p01-s00000002"


def test_prune_keeps_the_newest_complete_and_drops_older_torn_ones(tmp_path):
    store = checkpoint.LocalStore(tmp_path)
    for phase, step, complete in [(0, 2, True), (0, 4, True), (0, 5, False), (0, 6, True), (1, 2, True), (1, 4, False)]:
        folder = tmp_path / checkpoint.checkpoint_name(phase, step)
        folder.mkdir()
        (folder / "trainer.pt").write_bytes(b"x")
        if complete:
            (folder / checkpoint.MARKER).write_text("1")
    checkpoint.prune(store, keep=2)
    assert store.names() == {"ckpt-p00-s00000006": True, "ckpt-p01-s00000002": True, "ckpt-p01-s00000004": False}


def test_checkpoints_round_trip_through_an_s3_compatible_server(tmp_path, s3_server):
    store = checkpoint.S3Store("s3://runs/team/run-1", endpoint_url=s3_server, region="us-east-1")
    local = tmp_path / "local"
    (local / "adapter").mkdir(parents=True)
    (local / "adapter" / "adapter_model.safetensors").write_bytes(os.urandom(70_000))
    (local / "trainer.pt").write_bytes(b"state")
    store.upload(local, "ckpt-p00-s00000002")
    assert store.names() == {"ckpt-p00-s00000002": True}
    store.download("ckpt-p00-s00000002", tmp_path / "back")
    for path in ("adapter/adapter_model.safetensors", "trainer.pt"):
        assert (tmp_path / "back" / path).read_bytes() == (local / path).read_bytes()
    assert (tmp_path / "back" / checkpoint.MARKER).exists()

    # A whole run against the server: checkpoints land there, a second start resumes from the newest.
    settings = {"checkpoint": {"store": "s3://runs/team/run-2", "endpoint_url": s3_server, "region": "us-east-1",
                               "keep": 2}}
    recipe = tiny_recipe(tmp_path, phases=[("cpt", 4)], **settings)
    run(recipe, out=lambda line: None)
    store = checkpoint.S3Store("s3://runs/team/run-2", endpoint_url=s3_server, region="us-east-1")
    assert store.names() == {"ckpt-p00-s00000002": True, "ckpt-p00-s00000004": True}
    lines = []
    run(tiny_recipe(tmp_path, phases=[("cpt", 4), ("sft", 2)], **settings), out=lines.append)
    assert lines[0] == "resuming from checkpoint ckpt-p00-s00000004"
    assert checkpoint.latest_complete(store) == "ckpt-p01-s00000002"
    # Deleting a marker first makes that checkpoint invisible before its files go.
    store.client.delete_object(Bucket="runs", Key="team/run-2/ckpt-p01-s00000002/COMPLETE")
    assert checkpoint.latest_complete(store) == "ckpt-p00-s00000004"


def test_a_slow_upload_does_not_stall_the_loop(tmp_path):
    class SlowStore(checkpoint.LocalStore):
        def upload(self, local_dir, name):
            time.sleep(0.5)
            super().upload(local_dir, name)

    uploader = checkpoint.Uploader(SlowStore(tmp_path / "store"), tmp_path / "staging", keep=3)

    class Model:
        def save_pretrained(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "adapter_model.safetensors").write_bytes(b"x")

    start = time.monotonic()
    uploader.save(Model(), {"step": 1}, "ckpt-p00-s00000001")
    assert time.monotonic() - start < 0.3
    uploader.wait()
    assert checkpoint.latest_complete(uploader.store) == "ckpt-p00-s00000001"


def test_it_checkpoints_and_stops_on_sigterm(tmp_path):
    """The agent's dead-man switch sends SIGTERM: the trainer saves where it is, exits 75, and resumes there."""
    recipe_path = _recipe_file(tmp_path)
    victim = _train(recipe_path)
    metrics = tmp_path / "metrics.jsonl"
    _signal_after(victim, metrics, 4, signal.SIGTERM)
    out = victim.communicate(timeout=120)[0]
    assert victim.returncode == STOPPED_EXIT, out
    last = max(_last_by_step(metrics))  # (phase, step) of the last step it trained
    assert "stopped on request at" in out
    assert checkpoint.latest_complete(checkpoint.LocalStore(tmp_path / "checkpoints")) == \
        checkpoint.checkpoint_name(*last)  # saved exactly there, not at the last interval
    resumed = _train(recipe_path)
    out = resumed.communicate(timeout=180)[0]
    assert resumed.returncode == 0 and f"resuming from checkpoint {checkpoint.checkpoint_name(*last)}" in out


def test_a_checkpoint_of_another_recipe_is_refused_before_its_adapter_is_loaded(tmp_path):
    """Another phase at the checkpoint's position (and here another adapter shape, which loading first would trip
    over): the error names the checkpoint and the phase."""
    run(tiny_recipe(tmp_path, phases=[("cpt", 2)]), out=lambda line: None)
    other = tiny_recipe(tmp_path, phases=[("sft", 2)], lora={"r": 8})
    with pytest.raises(RecipeError, match="checkpoint ckpt-p00-s00000002 is from phase 'cpt', which this recipe does "
                                          "not have at position 0"):
        run(other, out=lambda line: None)
