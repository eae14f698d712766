"""The trainer on several ranks (gloo on the CPU, started by torchrun as a box starts it): the loss, the gradients and
the saved adapter equal a one-process run on the same global batch; a rank killed mid-step resumes from the sharded
checkpoint to the same result as an uninterrupted run; a guard that fails on one rank stops every rank."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training import checkpoint, distributed
from training.examples.tiny import TINY_CONFIG
from training.recipe import ModelSettings, RecipeError, validate

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("distributed_worker.py")
STEPS = 4
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _data(path):
    """Rows of the same number of label tokens on every rank (319 bytes: 10 full rows of 32 a sample), so that the
    mean of the ranks' mean losses is the whole batch's mean."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(12):
            f.write(json.dumps({"text": "".join(rng.choice("abcdefghij klmnop") for _ in range(319))}) + "\n")


def _recipe(work_dir, gpus, global_batch=4):
    work_dir.mkdir(parents=True, exist_ok=True)
    _data(work_dir / "cpt.jsonl")
    raw = {
        "model": {"config": {**TINY_CONFIG, "num_experts": 8}, "dtype": "float32"}, "lora": {"r": 4, "alpha": 8},
        "batch_size": global_batch // gpus, "grad_accum": 2, "seq_len": 32, "lr": 1.0e-3, "gpus": gpus,
        "checkpoint": {"store": "checkpoints", "staging": "staging", "every": 2},
        "metrics": {"jsonl": "metrics.jsonl"}, "phases": [{"kind": "cpt", "data": "cpt.jsonl", "steps": STEPS}],
    }
    path = work_dir / "recipe.json"
    path.write_text(json.dumps(raw))
    return path


def _start(args):
    return subprocess.Popen(args, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _torchrun(gpus, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", *args]


def _finish(proc, timeout_s=150):
    out = proc.communicate(timeout=timeout_s)[0]
    assert proc.returncode == 0, out
    return out


def _records(work_dir):
    return {r["step"]: r for r in map(json.loads, open(work_dir / "metrics.jsonl"))}


def _adapter(work_dir):
    store = work_dir / "checkpoints"
    name = checkpoint.latest_complete(checkpoint.LocalStore(store))
    return name, load_file(store / name / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same recipe on 1, 2 and 4 ranks (one global batch of 4 rows): work folder by rank count."""
    root = tmp_path_factory.mktemp("runs")
    folders = {gpus: root / f"gpus-{gpus}" for gpus in (1, 2, 4)}
    procs = [_start(distributed.command(_recipe(folders[gpus], gpus), gpus)) for gpus in (1, 2, 4)]
    for proc in procs:
        _finish(proc)
    return folders


@pytest.mark.parametrize("gpus", [2, 4])
def test_it_trains_on_several_ranks_as_one_process_does(runs, gpus):
    one, many = _records(runs[1]), _records(runs[gpus])
    assert sorted(many) == list(range(1, STEPS + 1))
    for step in one:
        for key in ("loss", "grad_norm_routed", "grad_norm_attention", "grad_norm_total", "routed_b_norm"):
            assert many[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-7), (step, key)
        assert many[step]["tokens"] == one[step]["tokens"]
        # every rank's own slice of the routed LoRA got a gradient, and its figures are in the record
        assert [r["rank"] for r in many[step]["ranks"]] == list(range(gpus))
        assert all(r["grad_norm_routed_local"] > 0 for r in many[step]["ranks"])
    assert many[1]["guard_checked"]


@pytest.mark.parametrize("gpus", [2, 4])
def test_the_router_load_is_every_ranks_tokens_summed(runs, gpus):
    # Expert parallel: each rank counts its own tokens by global expert id; the phase's end sums them over the ranks.
    one, many = _records(runs[1])[STEPS], _records(runs[gpus])[STEPS]
    positions = STEPS * 4 * 32 * 2  # steps x global rows x seq_len x grad_accum, all ranks together
    top_k = TINY_CONFIG["num_experts_per_tok"]
    assert len(many["router_load"]) == TINY_CONFIG["num_hidden_layers"]
    assert all(len(row) == 8 for row in many["router_load"])  # every expert of the model, not a rank's slice
    assert [sum(row) for row in many["router_load"]] == [positions * top_k] * TINY_CONFIG["num_hidden_layers"]
    # The same rows routed by the same weights: the same experts chosen as on one process (a near tie may flip).
    moved = sum(abs(a - b) for r1, r2 in zip(one["router_load"], many["router_load"], strict=True)
                for a, b in zip(r1, r2, strict=True))
    assert moved <= 0.02 * positions * top_k


@pytest.mark.parametrize("gpus", [2, 4])
def test_it_saves_one_peft_adapter_equal_to_the_one_process_adapter(runs, gpus):
    name, expected = _adapter(runs[1])
    got_name, got = _adapter(runs[gpus])
    assert got_name == name
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-6)
    folder = runs[gpus] / "checkpoints" / name
    one = runs[1] / "checkpoints" / name
    assert sorted(p.name for p in (folder / "adapter").iterdir()) == sorted(p.name for p in (one / "adapter").iterdir())
    config, one_config = ({k: sorted(v) if isinstance(v, list) else v
                           for k, v in json.loads((f / "adapter" / "adapter_config.json").read_text()).items()}
                          for f in (folder, one))
    assert config == one_config
    assert (folder / "vllm").is_dir()  # the export is made once, from the gathered adapter
    assert len(list((folder / "sharded").glob("*.distcp"))) == gpus
    assert sorted(p.name for p in folder.glob("rng-*.pt")) == [f"rng-{r}.pt" for r in range(gpus)]


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory):
    """The worker's gradients and guard on 2 ranks: (what rank 0 saved, the output)."""
    out = tmp_path_factory.mktemp("grads") / "grads.pt"
    printed = _finish(_start(_torchrun(2, str(WORKER), "grads", str(out))))
    return torch.load(out), printed


def test_it_averages_every_lora_gradient_like_one_process_on_the_whole_batch(worker_run):
    result = worker_run[0]
    assert sorted(result["got"]) == sorted(result["expected"])
    for name, expected in result["expected"].items():
        assert expected.abs().max() > 0, name
        torch.testing.assert_close(result["got"][name], expected, rtol=1e-4, atol=1e-8, msg=name)
    # LoRA attached before sharding: every factor outside the routed experts is an FSDP shard (averaged), none a
    # replicated tensor that each rank would train on its own
    dense = sorted(n for n in result["expected"] if ".experts." not in n)
    assert result["fsdp_sharded"] == dense and dense


def test_it_resumes_a_rank_killed_mid_step_from_the_sharded_checkpoint(runs, tmp_path):
    work = tmp_path / "killed"
    recipe = _recipe(work, 2)
    # checkpoints at steps 2 and 4; rank 1 dies in its 6th micro-step, the second of step 3
    victim = _start(_torchrun(2, str(WORKER), "die", "1", "6", str(recipe)))
    out = victim.communicate(timeout=150)[0]
    assert victim.returncode != 0, out
    assert checkpoint.latest_complete(checkpoint.LocalStore(work / "checkpoints")) == "ckpt-p00-s00000002"

    out = _finish(_start(distributed.command(recipe, 2)))
    assert "resuming from checkpoint ckpt-p00-s00000002" in out
    whole, resumed = _records(runs[2]), _records(work)
    for step in (3, 4):
        assert resumed[step]["loss"] == pytest.approx(whole[step]["loss"], rel=1e-5)
        assert resumed[step]["grad_norm_total"] == pytest.approx(whole[step]["grad_norm_total"], rel=1e-4)
    (name, expected), (got_name, got) = _adapter(runs[2]), _adapter(work)
    assert got_name == name
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-7)


def test_it_stops_every_rank_when_a_guard_fails_on_one(worker_run):
    out = worker_run[1]
    assert "rank 0 stopped: rank 1 of 2: layer 1 got no gradient here" in out
    assert "rank 1 stopped: rank 1 of 2: layer 1 got no gradient here" in out


def test_it_refuses_a_rank_count_other_than_the_recipes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=re.escape("the recipe asks for 1 GPU(s) but 2 rank(s) were started")):
        distributed.join(1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match=re.escape("the recipe asks for 2 GPU(s) but 1 rank(s) were started")):
        distributed.join(2)
    assert isinstance(distributed.join(1), distributed.OneRank)


def test_the_launch_command_follows_the_recipes_gpus():
    assert distributed.command("r.yaml", 1, python="py") == ["py", "-m", "training.train", "--recipe", "r.yaml"]
    assert distributed.command("r.yaml", 4, python="py") == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "training.train",
        "--recipe", "r.yaml"]


@pytest.mark.parametrize("gpus, problem", [
    (0, "gpus: must be an integer >= 1, got 0"), ("2", "gpus: must be an integer >= 1, got '2'"),
    (17, "gpus: at most 16 (the GPUs of one box), got 17"),
])
def test_the_recipe_refuses_a_bad_gpu_count(tmp_path, gpus, problem):
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    raw = {"model": {"config": TINY_CONFIG}, "gpus": gpus, "phases": [{"kind": "cpt", "data": "d.jsonl", "steps": 1}]}
    with pytest.raises(RecipeError, match=re.escape(problem)):
        validate(raw, base_dir=tmp_path)


def test_the_recipe_keeps_grpo_on_one_gpu(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "x"}\n')
    raw = {"model": {"config": TINY_CONFIG}, "gpus": 2, "phases": [
        {"kind": "grpo", "data": "d.jsonl", "steps": 1, "reward": "training.examples.rewards:answer_characters"}]}
    with pytest.raises(RecipeError, match="a grpo phase runs on one GPU"):
        validate(raw, base_dir=tmp_path)
    assert validate({**raw, "gpus": 1}, base_dir=tmp_path)["gpus"] == 1


def test_ranks_after_the_first_build_the_model_without_reading_or_holding_weights(tmp_path):
    """Every rank but the first builds the model on the meta device and gets its values from the first rank, a layer
    at a time, as it is sharded (the trainer tests above check they are the first rank's): a 235B model is read and
    held once per box, not once per GPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training import train

    fields = dict(TINY_CONFIG)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    for weights in (tmp_path / "model").glob("*.safetensors"):
        weights.unlink()  # nothing to read: a rank that tried would fail
    first, other = (distributed.Ranks(rank, 2, torch.device("cpu"), mesh=None) for rank in (0, 1))
    assert first.build_device().type == "cpu"
    assert distributed.OneRank(torch.device("cpu")).build_device().type == "cpu"
    model = train.build_model(ModelSettings(path=str(tmp_path / "model"), dtype="float32"), other.build_device())
    assert {p.device.type for p in model.parameters()} == {"meta"}
