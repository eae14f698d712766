"""The memory plan (training/memory_plan.py) against what the H200 measured (issue 41: r=32, 2 x 2048 tokens a
micro-step, budgets imposed with torch.cuda.set_per_process_memory_fraction): the reserve each plan predicts, the runs
that did not fit, and the plan chosen for each budget."""

import subprocess
import sys
from dataclasses import replace

import pytest

from training import head_loss, memory_plan
from training.memory_plan import SHAPES, Run, choose, estimate, steps

Q36, Q30 = SHAPES["Qwen3.6-35B-A3B"], SHAPES["Qwen3-30B-A3B"]
# What the benchmark measured: the text model alone, 34.66 billion parameters (the published checkpoint, which the
# trainer loads whole, adds its vision tower).
Q36_TEXT = replace(Q36, total_params_b=34.66)
TOKENS = 2 * 2048

# (model, checkpointing (a share of the layers), optimizer, measured peak reserved GiB): the calibration points.
MEASURED = [
    (Q36_TEXT, False, "adamw", 108.7),  # whole H200, 17,520 tokens/s
    (Q36_TEXT, 22 / 40, "adamw_8bit_bf16", 83.5),  # 96 GiB budget, 14,944 tokens/s
    (Q36_TEXT, 6 / 40, "adamw_8bit_bf16", 89.4),  # 96 GiB budget, the recalibrated plan, 16,869 tokens/s
    # 76 and 80 GiB budgets, 10,499 and 10,101 tokens/s; and on a real 80 GB H100, no budget, 9,761 tokens/s
    (Q36_TEXT, True, "adamw_offload_bf16", 73.8),
    (Q36_TEXT, True, "adamw", 95.1),  # 96 GiB budget, 8,735 tokens/s (before the DeltaNet layers' norm kernels)
    (Q30, True, "adamw", 78.2),  # 80 GiB budget, 16,365 tokens/s
    (Q30, True, "adamw", 78.7),  # again in another lease, 16,601 tokens/s
    (Q30, False, "adamw", 89.2),  # whole H200 (bench/NOTES_train_step.md), 21,341 tokens/s
    (Q30, False, "adamw", 90.3),  # again in another lease, 22,684 tokens/s
    (Q30, 0.5, "adamw_8bit", 77.4),  # 80 GiB budget, our 8-bit moments, 18,687 tokens/s
    (Q30, True, "adamw_8bit", 71.6),  # 74 GiB budget, our 8-bit moments, 16,315 tokens/s
    (Q30, 0.75, "adamw_8bit", 74.3),  # 76 GiB budget, 17,668 tokens/s
    (Q30, False, "adamw_8bit", 83.2),  # 85 GiB budget, 21,725 tokens/s
    (Q30, 0.5, "adamw_8bit_bf16", 73.1),  # 74 GiB budget, bf16 factors, 18,850 tokens/s
    (Q30, 34 / 48, "adamw_8bit_bf16", 69.2),  # a real 80 GB H100, no budget, 15,694 tokens/s
]
# How far off the model may be. The same run reserves up to 1.1 GiB more in one lease than in another (89.2 and 90.3
# above), so the slack is set to keep every 30B-A3B point within 0.7 GiB either way; the 35B-A3B points come out 0.3 to
# 0.7 GiB high. Over is safe: a plan predicted too small is a run out of memory on a rented card.
UNDER_GIB, OVER_GIB = 0.7, 1.5


def shape_with_layers(shape, layers):
    """The model cut to `layers` decoder layers: its embeddings and head (2 x vocab x hidden) stay."""
    outside = 2 * shape.vocab * shape.hidden / 1e9
    per_layer = (shape.total_params_b - outside) / shape.layers
    return replace(shape, layers=layers, total_params_b=outside + per_layer * layers)


@pytest.mark.parametrize(("shape", "checkpointing", "optimizer", "reserved"), MEASURED)
def test_the_predicted_reserve_is_close_to_the_measured_one_and_rarely_under(shape, checkpointing, optimizer,
                                                                             reserved, monkeypatch):
    """The timed steps' reserve (the figures measured), without the first step's extra."""
    monkeypatch.setattr(memory_plan, "FIRST_STEP", dict.fromkeys(memory_plan.FIRST_STEP, 1.0))
    plan = estimate(Run(shape, tokens=TOKENS), checkpointing, optimizer, 141.0)
    assert -UNDER_GIB <= plan.total_gib - reserved <= OVER_GIB


# (model, checkpointing, optimizer, measured tokens/s against the same model's with no checkpointing and float32
# moments on the whole card): the speed calibration points, each run through the plan's own speed.
MEASURED_SPEEDS = [
    (Q36_TEXT, 22 / 40, "adamw_8bit_bf16", 14_944 / 17_520),  # 96 GiB budget
    (Q36_TEXT, True, "adamw_offload_bf16", 10_499 / 17_520),  # 76 GiB budget
    (Q30, 0.5, "adamw_8bit", 18_687 / 22_684),
    (Q30, 0.75, "adamw_8bit", 17_668 / 22_684),
    (Q30, True, "adamw_8bit", 16_315 / 22_684),
    (Q30, False, "adamw_8bit", 21_725 / 22_684),
    (Q30, 0.5, "adamw_8bit_bf16", 18_850 / 22_684),
]


@pytest.mark.parametrize(("shape", "checkpointing", "optimizer", "measured"), MEASURED_SPEEDS)
def test_the_predicted_speed_is_within_2_percent_of_the_measured_one(shape, checkpointing, optimizer, measured):
    """What the ranking prices a card at: the whole card's measured tokens/s times the plan's speed."""
    plan = estimate(Run(shape, tokens=TOKENS), checkpointing, optimizer, 141.0)
    assert plan.speed == pytest.approx(measured, rel=0.02)


def test_the_runs_that_ran_out_of_memory_do_not_fit_and_those_that_ran_do():
    q36, q30 = Run(Q36_TEXT, tokens=TOKENS), Run(Q30, tokens=TOKENS)
    assert not estimate(q36, False, "adamw", 96.0).fits  # 96 GiB without checkpointing
    assert estimate(q36, True, "adamw", 96.0).fits  # with it, 95.1 GiB reserved
    for layers in (40, 36):  # 80 GiB, even with checkpointing
        assert not estimate(Run(shape_with_layers(Q36_TEXT, layers), tokens=TOKENS), True, "adamw", 80.0).fits
    assert not estimate(q30, False, "adamw", 80.0).fits
    assert estimate(q30, True, "adamw", 80.0).fits  # 78.2 GiB reserved
    # 36 of 48 layers checkpointed with 8-bit moments ran out of memory in 74 GiB (predicted 73.8 with less slack)
    assert not estimate(q30, 0.75, "adamw_8bit", 74.0).fits
    assert estimate(q30, True, "adamw_8bit", 74.0).fits  # 71.6 GiB reserved
    # bf16 factors: no checkpointing ran out of memory in 80 GiB, a quarter of the layers in 77; half ran in 74
    assert not estimate(q30, False, "adamw_8bit_bf16", 80.0).fits
    assert not estimate(q30, 0.25, "adamw_8bit_bf16", 77.0).fits
    assert estimate(q30, 0.5, "adamw_8bit_bf16", 74.0).fits  # 73.1 GiB reserved over the timed steps
    assert estimate(q30, False, "adamw_8bit", 85.0).fits  # 83.2


def test_each_budget_gets_the_fastest_plan_that_leaves_the_headroom_kept():
    q36, q30 = Run(Q36, tokens=TOKENS), Run(Q30, tokens=TOKENS)
    assert choose(q36, 141.0).name == "no checkpointing, float32 moments"
    assert choose(q30, 141.0).name == "no checkpointing, float32 moments"
    # The fastest plan that leaves 6 GiB, not the first: 8-bit moments cost 3% of a step on our kernel, checkpointing
    # 26%; half the layers checkpointed with 8-bit moments and bf16 factors ran 18,850 tokens/s at 73.1 GiB in 74.
    on_80 = choose(q30, 80.0)
    assert on_80.name == "checkpointing 23 of 48 layers, 8-bit moments and bf16 factors"
    assert on_80.roomy and 6.0 <= on_80.headroom_gib < 6.3 and on_80.total_gib <= 74.0
    assert on_80.speed > estimate(q30, True, "adamw_8bit", 80.0).speed  # which leaves room too: 16,315 at 71.6
    # one layer fewer would keep less than the headroom
    assert not estimate(q30, 22 / 48, "adamw_8bit_bf16", 80.0).roomy and estimate(q30, 22 / 48, "adamw_8bit_bf16",
                                                                                   80.0).fits
    for budget in (141.0, 100.0, 96.0, 90.0, 85.0, 80.0, 76.0, 74.0):
        for run in (q36, q30):
            plan = choose(run, budget)
            assert plan is None or plan.roomy or not any(p.roomy for p in memory_plan.plans(run, budget))


def test_a_card_that_no_plan_leaves_room_on_takes_the_plan_with_the_most_headroom():
    q36 = Run(Q36, tokens=TOKENS)
    # 35B-A3B in 76 GiB: 8-bit moments with bf16 factors (78.7 GiB) do not fit; the moments on the host (75.1) fit,
    # 0.9 GiB short of nothing, with no plan leaving the 6 GiB (measured: 73.8 GiB, 10,499 tokens/s)
    plan = choose(q36, 76.0)
    assert plan.name == "checkpointing, moments on the host and bf16 factors" and not plan.roomy
    assert plan.headroom_gib == max(p.headroom_gib for p in memory_plan.plans(q36, 76.0))
    assert choose(q36, 75.0) is None
    assert memory_plan.take(q36, 75.0).name == "checkpointing, moments on the host and bf16 factors"
    assert not memory_plan.take(q36, 75.0).fits


def test_the_headroom_kept_is_6_gib_and_a_tenth_of_a_small_card():
    assert memory_plan.kept_gib(95.1) == 6.0 and memory_plan.kept_gib(40.0) == 4.0
    for total in (10.0, 50.0, 54.0, 70.0, 120.0):
        least = memory_plan.roomy_from(total)
        assert least - memory_plan.kept_gib(least) == pytest.approx(total)
        assert least - 0.01 - memory_plan.kept_gib(least - 0.01) < total


def test_cards_as_listed_leave_the_driver_its_share():
    q36 = Run(Q36, tokens=TOKENS)
    usable = memory_plan.usable_gib
    assert choose(q36, usable(140.4)).name == "no checkpointing, float32 moments"  # an H200
    # A 96 GB card (95.6 GiB) leaves 93.7 for the allocator (the context, and a GiB for what CUDA holds beside it):
    # float32 moments do not fit; 8-bit moments with bf16 factors do, keeping the activations of 26 layers and 6 GiB
    # free: within 89 GiB, the practitioners' goal.
    on_96 = choose(q36, usable(95.6))
    assert on_96.name == "checkpointing 14 of 40 layers, 8-bit moments and bf16 factors"
    assert on_96.total_gib <= 89.0 and on_96.roomy
    # An 80 GB card (79.6 GiB, 77.7 for the allocator): the weights (65.2) and the float32 factors with their
    # gradients (14.1) fill it; bf16 factors (7.0) with 8-bit moments (3.6) go a GiB over; the moments on the host
    # leave 2.6 GiB: taken.
    plan = estimate(q36, True, "adamw_offload", usable(79.6))
    assert plan.weights_gib + plan.lora_gib > usable(79.6)
    assert -1.5 < estimate(q36, True, "adamw_8bit_bf16", usable(79.6)).headroom_gib < 0.0
    assert choose(q36, usable(79.6)).name == "checkpointing, moments on the host and bf16 factors"
    on_h100 = choose(Run(Q30, tokens=TOKENS), usable(79.6))
    assert on_h100.name == "checkpointing 31 of 48 layers, 8-bit moments and bf16 factors" and on_h100.roomy


def test_the_recipes_own_choice_is_a_floor_and_recipe_mode_is_it_alone():
    q30 = Run(Q30, tokens=TOKENS)
    assert choose(q30, 141.0, optimizer="adamw_8bit").name == "no checkpointing, 8-bit moments"
    assert choose(q30, 141.0, checkpointing=True).name == "checkpointing, float32 moments"
    assert choose(q30, 80.0, mode="recipe") is None  # no checkpointing asked for: it does not fit
    assert choose(q30, 60.0, host_gib=0.0) is None  # a CPU run has no host to offload to
    assert choose(q30, 66.0).optimizer == "adamw_offload_bf16"  # 19.1 GiB on the host
    assert choose(q30, 66.0, host_gib=19.0) is None and choose(q30, 66.0, host_gib=19.2) is not None
    assert memory_plan.candidates("adamw_offload", False, layers=4)[:5] == [
        (0.0, "adamw_offload"), (0.25, "adamw_offload"), (0.5, "adamw_offload"), (0.75, "adamw_offload"),
        (1.0, "adamw_offload")]
    assert memory_plan.candidates("adamw_offload", True) == [
        (True, "adamw_offload"), (True, "adamw_8bit_bf16"), (True, "adamw_offload_bf16")]
    assert [p.optimizer for p in memory_plan.plans(q30, 0.0, host_gib=0.0)][-1] == "adamw_8bit_bf16"
    assert memory_plan.candidates("adamw_offload_bf16", True) == [(True, "adamw_offload_bf16")]


def test_each_part_is_the_arithmetic_of_the_shape():
    plan = estimate(Run(Q36, tokens=TOKENS), False, "adamw", 141.0)
    routed = 40 * 256 * 32 * (2 * 2048 + 3 * 512)  # 1.85 billion routed-expert LoRA parameters
    assert routed == 1_845_493_760
    assert plan.weights_gib == pytest.approx(35e9 * 2 / 2**30)  # 65.2 GiB of bf16 weights
    params = Q36.lora_params(32)
    assert plan.lora_gib == pytest.approx(params * 8 / 2**30) and plan.optimizer_gib == plan.lora_gib
    assert estimate(Run(Q36, tokens=TOKENS), False, "adamw_8bit", 141.0).optimizer_gib == pytest.approx(
        params * 2.03125 / 2**30)
    bf16 = estimate(Run(Q36, tokens=TOKENS), False, "adamw_8bit_bf16", 141.0)  # a bf16 factor and its gradient
    assert bf16.lora_gib == pytest.approx(params * 4 / 2**30) and bf16.optimizer_gib == pytest.approx(
        params * 2.03125 / 2**30)
    assert estimate(Run(Q36, tokens=TOKENS), False, "adamw_offload", 141.0).host_gib == pytest.approx(
        params * 16 / 2**30)
    two = estimate(Run(Q36, tokens=TOKENS, gpus=2), False, "adamw", 141.0)
    assert two.weights_gib == pytest.approx(plan.weights_gib / 2) and two.activations_gib == plan.activations_gib


def test_a_card_chooses_the_plan_its_step_says():
    run = Run(Q36, tokens=TOKENS)
    ladder = steps(run)
    names = [p.name for _, p in ladder]
    # The least card runs the most frugal plan, tight; a bigger one the fastest that leaves 6 GiB. 8-bit moments with
    # bf16 factors cost 3% of a step and each layer checkpointed about 0.9%: a card short of float32 moments drops
    # them before it recomputes anything, and every count of layers checkpointed has its span of cards.
    assert names[0] == "checkpointing, moments on the host and bf16 factors" and not ladder[0][1].roomy
    assert names[-1] == "no checkpointing, float32 moments"
    eight_bit = [name for name in names if name.endswith("8-bit moments and bf16 factors")]
    assert eight_bit[0] == "checkpointing, 8-bit moments and bf16 factors"
    assert eight_bit[-1] == "no checkpointing, 8-bit moments and bf16 factors" and len(eight_bit) == 40
    assert all(plan.roomy for _, plan in ladder[1:])
    speeds = [p.speed for _, p in ladder]  # a bigger card never runs a slower plan
    assert speeds == sorted(speeds) and speeds[-1] == 1.0
    for card, plan in ladder:
        assert choose(run, memory_plan.usable_gib(card + 0.01)).name == plan.name
        assert choose(run, memory_plan.usable_gib(card - 0.01)) is None or \
            choose(run, memory_plan.usable_gib(card - 0.01)).name != plan.name


def test_it_reads_the_head_chunk_of_the_trainer_and_imports_no_torch():
    assert memory_plan.HEAD_CHUNK_TOKENS == head_loss.CHUNK_TOKENS
    code = "import sys, training.memory_plan; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
