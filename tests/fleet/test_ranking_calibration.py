"""The throughput table: its seed figures, lookups by GPU family and kernel path, estimates, and the run update."""

from decimal import Decimal

import pytest

from fleet.providers.records import OfferRecord
from fleet.ranking import SEED_CALIBRATION, Calibration, Phase, Workload, ThroughputModel, record_step_time
from fleet.ranking.throughput import (
    ESTIMATE_DISCOUNT,
    MAX_WEIGHT,
    MULTI_GPU_EFFICIENCY,
    SEED_WEIGHT,
    model_tflops_of,
    tokens_per_s,
)

# docs/field-notes.md's SFT recipe: batch 2 x 16 accumulation x 2,048 tokens = 65,536 tokens a step, 3B active.
SFT = Workload(grad_accum=16, lora_rank=64, phases=(Phase("sft", 100),))


def make_offer(**changes) -> OfferRecord:
    values = dict(
        provider="vast", offer_id="1", machine_id="m1", host_id="h1", gpu_name="H200", num_gpus=1,
        gpu_ram_gb=141.0, compute_capability=90, cuda_max=12.8, driver_version="570.124.06", disk_gb=500.0,
        inet_up_mbps=1000.0, inet_down_mbps=1000.0, inet_up_usd_per_gb=Decimal("0"),
        inet_down_usd_per_gb=Decimal("0"), storage_usd_per_gb_month=Decimal("0.10"),
        gpu_usd_per_hour=Decimal("1.20"), total_usd_per_hour=Decimal("1.25"), min_bid_usd_per_hour=None,
        reliability=0.99, verified=True, rentable=True, is_bid=False, geolocation="Sweden, SE", dlperf=None,
        total_flops=None,
    )
    values.update(changes)
    return OfferRecord(**values)


def step_s(offer, recipe=SFT, calibration=SEED_CALIBRATION):
    t = ThroughputModel(calibration, recipe).calibrated(offer)
    return recipe.tokens_per_step / t.tokens_per_s


def test_it_reproduces_the_seed_step_times_for_the_seed_recipe():
    assert step_s(make_offer(gpu_name="B200", gpu_ram_gb=180.0, compute_capability=100)) == pytest.approx(28.5)
    assert step_s(make_offer(gpu_name="H200")) == pytest.approx(28.5)  # matched B200 within noise
    pro = make_offer(gpu_name="RTX PRO 6000 WS", gpu_ram_gb=96.0, compute_capability=120)
    assert step_s(pro) == pytest.approx(57.0 / 0.9)  # Triton, seeded 10% slower for the missing routed LoRA math


def test_it_runs_sm_120_on_the_fallback_at_about_half_the_triton_speed():
    pro = make_offer(gpu_name="RTX PRO 6000 WS", gpu_ram_gb=96.0, compute_capability=120)
    triton = ThroughputModel(SEED_CALIBRATION, Workload(kernel_path="triton")).calibrated(pro)
    fallback = ThroughputModel(SEED_CALIBRATION, Workload(kernel_path="grouped_mm")).calibrated(pro)
    assert (triton.kernel_path, fallback.kernel_path) == ("triton", "grouped_mm")
    assert 0.45 < fallback.tokens_per_s / triton.tokens_per_s < 0.6  # 112 s vs 57-63 s a step


def test_it_picks_the_kernel_path_from_the_architecture_on_auto():
    model = ThroughputModel(SEED_CALIBRATION, Workload())
    assert model.calibrated(make_offer(compute_capability=90)).kernel_path == "grouped_mm"
    assert model.calibrated(
        make_offer(gpu_name="RTX PRO 6000 S", gpu_ram_gb=96.0, compute_capability=120)).kernel_path == "triton"


def test_it_falls_back_to_the_gpu_family_for_name_variants():
    model = ThroughputModel(SEED_CALIBRATION, Workload())
    nvl = model.calibrated(make_offer(gpu_name="NVIDIA H200 NVL"))
    assert nvl.source == "calibrated H200/grouped_mm (seed figure)"
    assert not nvl.estimated
    assert model.calibrated(make_offer(gpu_name="H100 SXM", gpu_ram_gb=80.0)) is None


def test_it_scales_throughput_to_another_model_by_active_parameters():
    small = Workload(active_params_b=1.5, grad_accum=16)
    assert step_s(make_offer(), recipe=small) == pytest.approx(28.5 / 2)


def test_it_scales_multi_gpu_boxes_by_a_data_parallel_efficiency():
    one = ThroughputModel(SEED_CALIBRATION, SFT).calibrated(make_offer(num_gpus=1)).tokens_per_s
    four = ThroughputModel(SEED_CALIBRATION, SFT).calibrated(make_offer(num_gpus=4)).tokens_per_s
    assert four == pytest.approx(one * 4 * MULTI_GPU_EFFICIENCY)


def test_it_folds_a_finished_run_into_a_seeded_entry_as_one_weighted_observation():
    before = SEED_CALIBRATION.get("H200", "grouped_mm")
    # A run measured 40 s a step with the seed recipe: 65,536 / 40 = 1,638.4 tok/s x 18 GFLOP = 29.4912 TFLOP/s
    after = record_step_time(SEED_CALIBRATION, gpu_name="H200", kernel_path="grouped_mm", recipe=SFT,
                             step_seconds=40.0)
    entry = after.get("H200", "grouped_mm")
    observed = 29.4912
    # seed weight 2, one new run: (2 x seed + 1 x observed) / 3
    assert entry.model_tflops == pytest.approx((SEED_WEIGHT * before.model_tflops + observed) / (SEED_WEIGHT + 1))
    assert (entry.weight, entry.measured_runs) == (SEED_WEIGHT + 1, 1)
    assert SEED_CALIBRATION.get("H200", "grouped_mm") == before  # pure: the old table is unchanged
    assert step_s(make_offer(), calibration=after) == pytest.approx(65536 / tokens_per_s(entry.model_tflops, SFT))


def test_it_starts_an_entry_for_a_gpu_it_has_never_seen():
    after = record_step_time(SEED_CALIBRATION, gpu_name="NVIDIA H100 NVL", kernel_path="grouped_mm", recipe=SFT,
                             step_seconds=36.0)
    entry = after.get("H100 NVL", "grouped_mm")
    assert entry.model_tflops == pytest.approx(model_tflops_of(65536 / 36.0, SFT))
    assert (entry.weight, entry.measured_runs) == (1.0, 1)
    offer = make_offer(gpu_name="H100 NVL", gpu_ram_gb=94.0)
    t = ThroughputModel(after, SFT).calibrated(offer)
    assert not t.estimated and t.source == "calibrated H100 NVL/grouped_mm (1 run)"
    assert 65536 / t.tokens_per_s == pytest.approx(36.0)


def test_it_stops_growing_the_weight_so_the_mean_follows_recent_runs():
    calibration = SEED_CALIBRATION
    for _ in range(60):
        calibration = record_step_time(calibration, gpu_name="B200", kernel_path="grouped_mm", recipe=SFT,
                                       step_seconds=40.0)
    entry = calibration.get("B200", "grouped_mm")
    assert entry.weight == MAX_WEIGHT and entry.measured_runs == 60
    assert entry.model_tflops == pytest.approx(model_tflops_of(65536 / 40.0, SFT), rel=0.01)
    # a capped entry moves by 1 / (MAX_WEIGHT + 1) of the gap on the next run
    moved = record_step_time(calibration, gpu_name="B200", kernel_path="grouped_mm", recipe=SFT, step_seconds=20.0)
    gap = model_tflops_of(65536 / 20.0, SFT) - entry.model_tflops
    assert moved.get("B200", "grouped_mm").model_tflops == pytest.approx(entry.model_tflops + gap / (MAX_WEIGHT + 1))


def test_it_normalises_a_multi_gpu_run_to_one_gpu():
    after = record_step_time(Calibration({}), gpu_name="H200", kernel_path="grouped_mm", recipe=SFT,
                             step_seconds=10.0, num_gpus=4)
    per_gpu = 65536 / 10.0 / (4 * MULTI_GPU_EFFICIENCY)
    assert after.get("H200", "grouped_mm").model_tflops == pytest.approx(model_tflops_of(per_gpu, SFT))


@pytest.mark.parametrize("changes, message", [
    ({"step_seconds": 0}, "step_seconds must be a positive number"),
    ({"step_seconds": float("nan")}, "step_seconds must be a positive number"),
    ({"kernel_path": "auto"}, "kernel_path must be the path the run used"),
    ({"gpu_name": "  "}, "gpu_name is blank"),
    ({"num_gpus": 0}, "num_gpus must be a whole number"),
])
def test_it_rejects_a_report_it_cannot_use(changes, message):
    report = dict(gpu_name="H200", kernel_path="grouped_mm", recipe=SFT, step_seconds=30.0) | changes
    with pytest.raises(ValueError, match=message):
        record_step_time(SEED_CALIBRATION, **report)


def test_it_round_trips_the_table_through_a_plain_dict():
    after = record_step_time(SEED_CALIBRATION, gpu_name="H200", kernel_path="grouped_mm", recipe=SFT,
                             step_seconds=30.0)
    assert Calibration.from_dict(after.to_dict()) == after
    with pytest.raises(ValueError, match="kernel_path must be grouped_mm or triton"):
        Calibration.from_dict({"entries": [{"gpu_model": "H200", "kernel_path": "loop", "model_tflops": 3}]})
    with pytest.raises(ValueError, match="must be > 0"):
        Calibration.from_dict({"entries": [{"gpu_model": "H200", "kernel_path": "triton", "model_tflops": 0}]})


def test_it_estimates_an_uncalibrated_gpu_from_its_listing_and_says_so():
    model = ThroughputModel(SEED_CALIBRATION, SFT)
    h100 = make_offer(gpu_name="H100 NVL", gpu_ram_gb=94.0, total_flops=800.0)
    assert model.calibrated(h100) is None
    # anchored ratio: 0.05 achieved model TFLOP/s per listed TFLOP -> 40 TFLOP/s, discounted
    t = model.estimate(h100, listed_to_model=0.05)
    assert t.estimated and t.source == "estimate from 800 listed TFLOPS (no calibration)"
    assert t.tokens_per_s == pytest.approx(tokens_per_s(40.0, SFT) * ESTIMATE_DISCOUNT)


def test_it_caps_an_estimate_at_the_best_measured_card():
    model = ThroughputModel(SEED_CALIBRATION, SFT)
    huge = make_offer(gpu_name="X9000", gpu_ram_gb=141.0, total_flops=100000.0)
    assert model.estimate(huge, listed_to_model=0.05).tokens_per_s == pytest.approx(65536 / 28.5)


def test_it_estimates_from_dlperf_only_with_an_anchor_and_gives_up_without_figures():
    model = ThroughputModel(SEED_CALIBRATION, SFT)
    assert model.estimate(make_offer(gpu_name="X1", dlperf=100.0)) is None
    assert model.estimate(make_offer(gpu_name="X1", dlperf=100.0), dlperf_to_model=0.2).source == \
        "estimate from DLPerf 100 (no calibration)"
    assert model.estimate(make_offer(gpu_name="X1")) is None
