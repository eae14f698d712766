"""The 8-bit AdamW kernel (training/kernels/adamw8bit.py, in Triton's interpreter here): its first step is AdamW's,
later steps are its torch twin's (the same codes decoded, updated, encoded again; what a CPU steps with), moments
survive encoding within their companded precision, and the optimizer trains a small model to the loss float32
moments reach."""

import statistics

import pytest
import torch

from training import optimizers, train
from training.examples.tiny import TINY_CONFIG, tiny_recipe
from training.kernels import adamw8bit
from training.lora import attach_lora
from training.recipe import RunRecipe

HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}


def _params(*shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _grads(params, seed):
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * torch.logspace(-4, 0, p.shape[-1])


def test_the_first_step_is_adamws():
    ours, theirs = _params((7, 300), (5,)), _params((7, 300), (5,))
    for params in (ours, theirs):
        _grads(params, seed=1)
    optimizers.AdamW8bit(ours, **HYPER).step()
    torch.optim.AdamW(theirs, **HYPER).step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_later_steps_are_the_reference_arithmetic_and_the_codes_its_codes():
    ours, theirs = _params((3, 700)), _params((3, 700))
    optimizer = optimizers.AdamW8bit(ours, **HYPER)
    reference = {"m": torch.zeros(2100, dtype=torch.int8), "v": torch.zeros(2100, dtype=torch.uint8),
                 "ms": torch.zeros(9), "vs": torch.zeros(9)}  # 2,100 elements: 9 blocks of 256, the last partial
    for step in range(1, 6):
        for params in (ours, theirs):
            _grads(params, seed=10 + step)
        optimizer.step()
        adamw8bit.step_in_torch(theirs[0].data, theirs[0].grad, reference["m"], reference["v"], reference["ms"],
                                reference["vs"], lr=HYPER["lr"], beta1=HYPER["betas"][0], beta2=HYPER["betas"][1],
                                eps=HYPER["eps"], weight_decay=HYPER["weight_decay"], step_number=step)
        torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
        state = optimizer.state[ours[0]]
        torch.testing.assert_close(state["exp_avg_scale"], reference["ms"], rtol=1e-5, atol=0)
        # a value on a rounding edge may take the next code in one and not the other: at most one step, rarely
        for key, ref in (("exp_avg", "m"), ("exp_avg_sq", "v")):
            off = (state[key].int() - reference[ref].int()).abs()
            assert off.max() <= 1 and (off > 0).float().mean() < 0.01


def test_outside_the_interpreter_a_cpu_steps_in_torch_as_the_kernel_does(monkeypatch):
    """A CPU run of the trainer (no GPU, no TRITON_INTERPRET) gets the same optimizer, stepped in torch."""
    kernel, torch_only = _params((3, 700)), _params((3, 700))
    on_kernel, in_torch = optimizers.AdamW8bit(kernel, **HYPER), optimizers.AdamW8bit(torch_only, **HYPER)
    for step in range(1, 4):
        for params in (kernel, torch_only):
            _grads(params, seed=20 + step)
        on_kernel.step()
        monkeypatch.setattr(optimizers, "interpreting", lambda: False)
        in_torch.step()
        monkeypatch.undo()
        torch.testing.assert_close(kernel[0], torch_only[0], rtol=1e-5, atol=1e-6)
    assert optimizers.build("adamw_8bit", torch_only, lr=1e-3, weight_decay=0.0, device="cpu").__class__ is \
        optimizers.AdamW8bit  # what a recipe's adamw_8bit gets


@pytest.mark.parametrize("second", [False, True])
def test_encoding_keeps_small_values_relative_precision_and_never_decodes_a_second_moment_to_zero(second):
    """Within 8% down to a hundredth of its block's largest first moment and a ten-thousandth of its largest second
    moment (a linear code keeps that only down to about a tenth)."""
    values = torch.logspace(-8, 0, 256) * (1 if second else torch.where(torch.arange(256) % 2 == 0, 1.0, -1.0))
    decoded = adamw8bit.decode(*adamw8bit.encode(values, second), second)
    relative = (decoded - values).abs() / values.abs()
    within = values.abs() >= (1e-4 if second else 1e-2)
    assert within.sum() > 30 and relative[within].max() < 0.08
    if second:
        assert decoded.min() > 0
    else:
        assert (decoded.sign() == values.sign())[values.abs() > 1e-4].all()


def test_the_state_dict_holds_float32_moments_that_load_back_into_the_same_codes():
    params = _params((4, 260))
    optimizer = optimizers.AdamW8bit(params, **HYPER)
    for seed in (1, 2, 3):
        _grads(params, seed)
        optimizer.step()
    saved = optimizer.state_dict()
    entry = saved["state"][0]
    assert entry["exp_avg"].dtype == torch.float32 and entry["exp_avg"].shape == params[0].shape
    assert set(entry) == {"step", "exp_avg", "exp_avg_sq"} and float(entry["step"]) == 3
    again = optimizers.AdamW8bit(params, **HYPER)
    again.load_state_dict(saved)
    mine, theirs = optimizer.state[params[0]], again.state[params[0]]
    for key in ("exp_avg", "exp_avg_sq"):
        assert (mine[key].int() - theirs[key].int()).abs().max() <= 1
        torch.testing.assert_close(mine[f"{key}_scale"], theirs[f"{key}_scale"])
    plain = torch.optim.AdamW(params, **HYPER)  # and AdamW resumes from it as from its own
    plain.load_state_dict(saved)
    torch.testing.assert_close(plain.state[params[0]]["exp_avg"], entry["exp_avg"])


# Big enough that most moments are whole blocks of 256.
CONFIG = {**TINY_CONFIG, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8}


def test_it_trains_a_small_model_to_the_loss_of_float32_moments(tmp_path):
    """200 steps of a tiny MoE with LoRA on a fixed batch: the last 50 losses' mean within the spread float32 AdamW's
    own seeds give."""
    recipe = RunRecipe.from_dict(tiny_recipe(tmp_path, phases=(("cpt", 1),), config=CONFIG))
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(3, CONFIG["vocab_size"], (4, 32), generator=generator)

    def last_losses(make, seed):
        torch.manual_seed(seed)
        model = attach_lora(train.build_model(recipe.model, "cpu"), r=16, alpha=32)
        optimizer = make([p for p in model.parameters() if p.requires_grad])
        losses = []
        for _ in range(200):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return statistics.mean(losses[-50:])

    plain = [last_losses(lambda ps: torch.optim.AdamW(ps, lr=2e-3), seed) for seed in (1, 2, 3)]
    ours = last_losses(lambda ps: optimizers.AdamW8bit(ps, lr=2e-3), 1)
    spread = max(plain) - min(plain)
    assert abs(ours - statistics.mean(plain)) <= max(3 * spread, 0.02 * statistics.mean(plain)), (ours, plain)
    assert ours < last_losses(lambda ps: torch.optim.AdamW(ps, lr=0.0), 1) - 0.5  # it trained


@pytest.mark.parametrize("in_torch", [False, True])
def test_bf16_factors_keep_updates_smaller_than_bf16s_grid(monkeypatch, in_torch):
    """100 steps of 1e-4 each from 1.0, where bf16's grid is 2^-8 apart below 1: rounding to nearest would keep every
    element at 1.0; stochastic rounding moves each by a random walk on the grid whose mean is 0.99 (kernel, torch)."""
    if in_torch:
        monkeypatch.setattr(optimizers, "interpreting", lambda: False)
    param = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    optimizer = optimizers.build("adamw_8bit_bf16", [param], lr=1e-4, weight_decay=0.0, device="cpu")
    for _ in range(100):
        param.grad = torch.ones_like(param)  # Adam's update is the rate itself, every step
        optimizer.step()
    values = param.detach().float()
    assert param.dtype == torch.bfloat16
    assert abs(values.mean().item() - 0.99) < 5e-4, values.mean()
    assert (values < 1.0).float().mean() > 0.9 and values.min() > 0.95


def test_bf16_factors_are_refused_in_float32():
    with pytest.raises(optimizers.OptimizerError, match="bf16"):
        optimizers.build("adamw_8bit_bf16", _params((3, 4)), lr=1e-3, weight_decay=0.0, device="cpu")
