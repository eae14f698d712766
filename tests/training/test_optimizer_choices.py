"""The optimizer a recipe (or its memory plan) chooses: 8-bit moments train a small model to the loss float32 moments
reach; a checkpoint holds plain tensors for every choice and a run stopped and resumed under it ends where an
uninterrupted one does, under another choice too; offloading refuses a run without a GPU."""

import json
import statistics
import threading

import pytest
import torch
from safetensors.torch import load_file

from training import checkpoint, optimizers, train
from training.examples.tiny import TINY_CONFIG, tiny_recipe
from training.lora import attach_lora
from training.recipe import RecipeError, RunRecipe

# Big enough that most moments are whole blocks of 256.
CONFIG = {**TINY_CONFIG, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8}
LORA = {"r": 16, "alpha": 32}
STEPS, WINDOW = 200, 50


def _recipe(work_dir, optimizer, steps, every=1000, **settings):
    return tiny_recipe(work_dir, phases=(("cpt", steps),), config=CONFIG, optimizer=optimizer, lora=LORA, grad_accum=1,
                       lr=2e-3, checkpoint={"every": every}, metrics={"router_every": 0}, **settings)


def _losses(work_dir):
    return [json.loads(line)["loss"] for line in open(work_dir / "metrics.jsonl") if '"loss"' in line]


@pytest.mark.parametrize("frugal", ["adamw_8bit", "adamw_8bit_bf16"])
def test_eight_bit_moments_reach_the_loss_of_float32_moments(tmp_path, frugal):
    """Also with the factors and their gradients in bf16 (rounded stochastically)."""
    model = attach_lora(train.build_model(RunRecipe.from_dict(_recipe(tmp_path, "adamw", 1)).model, "cpu"),
                        r=LORA["r"], alpha=LORA["alpha"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    whole_blocks = sum(p.numel() for p in trainable if p.numel() % 256 == 0)
    assert whole_blocks / sum(p.numel() for p in trainable) > 0.8  # the comparison is about 8-bit moments
    ends = {}
    for name in ("adamw", frugal):
        train.run(_recipe(tmp_path / name, name, STEPS), out=lambda line: None)
        ends[name] = _losses(tmp_path / name)
    full, eight = ends["adamw"], ends[frugal]
    assert full[0] == eight[0] and full[0] - statistics.mean(full[-WINDOW:]) > 0.5  # the same start, and it learned
    # Within noise: both runs read the same batches, so the last 50 steps' means may differ by what the optimizer
    # does; noise is what those means carry from step to step, 3 standard errors of the float32 run's (about 0.014;
    # the seed of the data order alone moves it by 0.05; 8-bit moments moved it by 0.0064).
    noise = 3 * statistics.stdev(full[-WINDOW:]) / WINDOW ** 0.5
    assert abs(statistics.mean(eight[-WINDOW:]) - statistics.mean(full[-WINDOW:])) < noise


def _stopped_and_resumed(work_dir, first, then, monkeypatch, stop_at=3, steps=6):
    stop = threading.Event()

    def watch(line):
        if f"step {stop_at}/{steps}" in line:
            stop.set()

    monkeypatch.setattr(train, "STOP", stop)
    with pytest.raises(train.StopRequested):
        train.run(_recipe(work_dir, first, steps, every=100), out=watch)
    stop.clear()
    lines = []
    train.run(_recipe(work_dir, then, steps, every=100), out=lines.append)
    assert f"resuming from checkpoint {checkpoint.checkpoint_name(0, stop_at)}" in lines
    return _losses(work_dir)


@pytest.mark.parametrize("name", ["adamw", "adamw_8bit", "adamw_8bit_bf16"])
def test_a_run_stopped_and_resumed_ends_where_an_uninterrupted_one_does(tmp_path, monkeypatch, name):
    train.run(_recipe(tmp_path / "whole", name, 6), out=lambda line: None)
    resumed = _stopped_and_resumed(tmp_path / "resumed", name, name, monkeypatch)
    assert resumed[-3:] == pytest.approx(_losses(tmp_path / "whole")[-3:], rel=1e-5)
    # What the box wrote is plain tensors, loaded as every checkpoint is (weights_only), float32 moments whatever the
    # choice.
    store = checkpoint.LocalStore(tmp_path / "resumed" / "checkpoints")
    _, state = checkpoint.load(store, checkpoint.latest_complete(store), tmp_path / "read")
    moments = [v for entry in state["optimizer"]["state"].values() for k, v in entry.items() if k != "step"]
    assert moments and all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in moments)
    adapter = load_file(tmp_path / "read" / "adapter" / "adapter_model.safetensors")
    assert {t.dtype for t in adapter.values()} == {torch.bfloat16 if name == "adamw_8bit_bf16" else torch.float32}


def test_the_checkpoint_holds_plain_float32_moments_for_every_choice(tmp_path):
    params = [torch.nn.Parameter(torch.randn(64, 256)), torch.nn.Parameter(torch.randn(8))]
    for name in ("adamw", "adamw_8bit"):
        optimizer = optimizers.build(name, params, lr=1e-3, weight_decay=0.0, device="cpu")
        for _ in range(3):
            for p in params:
                p.grad = torch.randn_like(p)
            optimizer.step()
        torch.save(optimizers.state_dict(optimizer), tmp_path / f"{name}.pt")
        saved = torch.load(tmp_path / f"{name}.pt", weights_only=True)
        assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for entry in saved["state"].values()
                   for k, v in entry.items() if k != "step")
        assert all(isinstance(group["lr"], float) for group in saved["param_groups"])


def test_a_state_saved_under_one_choice_loads_under_another(tmp_path):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 256))]
    source = optimizers.build("adamw_8bit", params, lr=1e-3, weight_decay=0.0, device="cpu")
    for _ in range(3):
        params[0].grad = torch.randn_like(params[0])
        source.step()
    saved = optimizers.state_dict(source)
    full = optimizers.build("adamw", params, lr=1e-3, weight_decay=0.0, device="cpu")
    optimizers.load_state_dict(full, saved)
    assert torch.equal(full.state[params[0]]["exp_avg"], saved["state"][0]["exp_avg"])
    again = optimizers.build("adamw_8bit", params, lr=1e-3, weight_decay=0.0, device="cpu")
    optimizers.load_state_dict(again, optimizers.state_dict(full))
    assert again.state[params[0]]["exp_avg"].dtype == torch.int8  # 8-bit again, not float32
    # The same codes, each block's scale taken again from the decoded values: within 1% of the block's largest.
    moment = saved["state"][0]["exp_avg"]
    assert torch.allclose(optimizers.state_dict(again)["state"][0]["exp_avg"], moment, rtol=0,
                          atol=0.01 * float(moment.abs().max()))


def test_the_host_optimizer_steps_as_adamw_does_and_round_trips():
    torch.manual_seed(0)
    host_params = [torch.nn.Parameter(torch.randn(32, 16))]
    plain_params = [torch.nn.Parameter(host_params[0].detach().clone())]
    host = optimizers.HostAdamW(host_params, lr=1e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(plain_params, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(32, 16)
        host_params[0].grad, plain_params[0].grad = grad.clone(), grad.clone()
        host.step()
        plain.step()
    assert torch.allclose(host_params[0], plain_params[0], atol=1e-6)
    copy = optimizers.HostAdamW(host_params, lr=1e-2, weight_decay=0.1)
    optimizers.load_state_dict(copy, optimizers.state_dict(host))
    assert torch.equal(copy.state[copy.host_params[0]]["exp_avg_sq"], host.state[host.host_params[0]]["exp_avg_sq"])


def test_the_host_optimizer_keeps_bf16_factors_on_a_float32_copy():
    """adamw_offload_bf16: AdamW steps the float32 copy on the host; the card's bf16 factors are that copy rounded, so
    updates below bf16's grid add up there instead of being lost."""
    torch.manual_seed(0)
    factors = [torch.nn.Parameter(torch.randn(32, 16).to(torch.bfloat16))]
    reference = [torch.nn.Parameter(factors[0].detach().float())]  # the same start, in float32
    start = factors[0].detach().clone()
    host, plain = optimizers.HostAdamW(factors, lr=1e-4), torch.optim.AdamW(reference, lr=1e-4, weight_decay=0.0)
    for _ in range(20):
        grad = (torch.rand(32, 16) + 0.5).to(torch.bfloat16)  # one sign: AdamW moves every factor by the rate
        factors[0].grad, reference[0].grad = grad, grad.float()
        host.step()
        plain.step()
    assert factors[0].dtype == torch.bfloat16
    torch.testing.assert_close(host.host_params[0], reference[0].detach(), rtol=1e-5, atol=1e-6)  # AdamW's steps
    assert torch.equal(factors[0], host.host_params[0].to(torch.bfloat16))
    # 20 steps of about 1e-4 each: the copy moved 2e-3, under half of bf16's grid at 1 (3.9e-3), and the factors
    # follow it where it crossed a rounding edge
    assert (host.host_params[0] - start.float()).abs().mean() > 1.5e-3 and (factors[0] != start).any()
    with pytest.raises(optimizers.OptimizerError, match="bf16"):
        optimizers.build("adamw_offload_bf16", reference, lr=1e-3, weight_decay=0.0, device="cuda")


def test_offloading_is_refused_without_a_gpu(tmp_path):
    with pytest.raises(optimizers.OptimizerError, match="no GPU"):
        optimizers.build("adamw_offload", [torch.nn.Parameter(torch.zeros(2))], lr=1e-3, weight_decay=0.0,
                         device="cpu")
    with pytest.raises(RecipeError, match="adamw_offload .* this run has no GPU"):
        train.run(_recipe(tmp_path, "adamw_offload", 1), out=lambda line: None)
    assert train.main(["--recipe", str(_recipe_file(tmp_path))]) == 2


def _recipe_file(work_dir):
    path = work_dir / "recipe.json"
    path.write_text(json.dumps({"model": {"config": CONFIG, "dtype": "float32"}, "optimizer": "adamw_offload",
                                "phases": [{"kind": "cpt", "data": tiny_recipe(work_dir)["phases"][0]["data"],
                                            "steps": 1}]}))
    return path
