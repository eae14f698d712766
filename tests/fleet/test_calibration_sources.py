"""The calibration table takes only measurements of the ranking's recipe on a GPU: a CPU demo (kernel path "loop"), a
run of another model, a run through another kernel path than the recipe ranks the GPU with, or any box of the
simulated marketplace is never folded in, and the run says why."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from fleet.models import Instance, Offer, ThroughputCalibration
from fleet.offers.calibration import load_calibration, measurement_problem
from fleet.ranking import Workload
from runs import supervisor
from runs.models import MetricPoint, Run
from tests.fleet.offer_records import offer_record

pytestmark = pytest.mark.django_db
QWEN_35B = {"path": "Qwen/Qwen3.6-35B-A3B"}
TINY = {"config": {"model_type": "qwen3_moe", "hidden_size": 32}}


def _finished_run(*, model, kernel_path: str, gpu_name="RTX PRO 6000 S", offer_id="7", step_s=60.0) -> Run:
    now = timezone.now()
    run = Run.objects.create(name="demo", recipe={"model": model, "batch_size": 2, "grad_accum": 16,
                                                  "seq_len": 2048},
                             bucket="s3://bucket/runs", budget_usd=Decimal("5"), token_nonce="n", state="finished",
                             created_at=now, finished_at=now)
    box = Instance.objects.create(provider="vast", idempotency_key=f"box-{kernel_path}-{offer_id}", label="box",
                                  state="destroyed", purpose="training", offer_id=offer_id, gpu_name=gpu_name,
                                  image="img", disk_gb=250, requested_at=now, usd_per_hour=Decimal("1.10"))
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, phase=0, step=step, at=now + timedelta(seconds=step), step_s=step_s,
                    kernel_path=kernel_path, instance=box) for step in range(1, 11))
    return run


def _throughput(gpu: str, path: str) -> float:
    return load_calibration().get(gpu, path).model_tflops


def test_it_does_not_record_a_cpu_demo_run_as_a_triton_measurement(settings):
    settings.SIMULATOR_ENABLED = False
    before = _throughput("RTX PRO 6000", "triton")
    run = _finished_run(model=QWEN_35B, kernel_path="loop", step_s=0.05)  # a tiny CPU step: 11,000+ tok/s
    supervisor._calibrate(run, run.metrics.first().instance)
    assert not ThroughputCalibration.objects.exists()
    assert _throughput("RTX PRO 6000", "triton") == before
    event = run.events.get(kind="calibration")
    assert "loop kernel path, not a GPU one" in event.message


def test_it_does_not_record_a_run_of_another_model(settings):
    settings.SIMULATOR_ENABLED = False
    run = _finished_run(model=TINY, kernel_path="triton")
    supervisor._calibrate(run, run.metrics.first().instance)
    assert not ThroughputCalibration.objects.exists()
    assert "random weights" in run.events.get(kind="calibration").message


def test_it_never_records_a_box_of_the_simulated_marketplace(settings):
    settings.SIMULATOR_ENABLED = True
    run = _finished_run(model=QWEN_35B, kernel_path="triton")
    supervisor._calibrate(run, run.metrics.first().instance)
    assert not ThroughputCalibration.objects.exists()
    assert "simulated marketplace" in run.events.get(kind="calibration").message


def test_it_does_not_record_a_kernel_path_the_recipe_does_not_rank_the_gpu_with(settings):
    settings.SIMULATOR_ENABLED = False
    Offer.objects.create(**Offer.field_values(offer_record("90")), first_seen_at=timezone.now(),
                         last_seen_at=timezone.now())  # an H200: "auto" ranks it with grouped_mm
    run = _finished_run(model=QWEN_35B, kernel_path="triton", gpu_name="H200", offer_id="90")
    supervisor._calibrate(run, run.metrics.first().instance)
    assert not ThroughputCalibration.objects.exists()
    assert "recipe ranks this GPU with grouped_mm" in run.events.get(kind="calibration").message


def test_it_records_a_gpu_measurement_of_the_recipe(settings):
    settings.SIMULATOR_ENABLED = False
    run = _finished_run(model=QWEN_35B, kernel_path="triton", step_s=50.0)
    supervisor._calibrate(run, run.metrics.first().instance)
    row = ThroughputCalibration.objects.get()
    assert (row.gpu_model, row.kernel_path, row.measured_runs) == ("RTX PRO 6000 S", "triton", 1)
    assert not run.events.filter(kind="calibration").exists()


def test_it_says_why_a_measurement_does_not_count():
    recipe = Workload()
    assert measurement_problem(simulated=False, kernel_path="grouped_mm", recipe=recipe, run_model=QWEN_35B,
                               compute_capability=90) is None
    assert measurement_problem(simulated=False, kernel_path="triton", recipe=recipe,
                               run_model="/models/qwen3.6-35b-a3b/", compute_capability=120) is None
    assert "not Qwen3.6-35B-A3B" in measurement_problem(simulated=False, kernel_path="triton", recipe=recipe,
                                                         run_model={"path": "Qwen/Qwen3-30B-A3B"})
    assert "not a GPU one" in measurement_problem(simulated=False, kernel_path="", recipe=recipe, run_model=QWEN_35B)
    # a GPU run on a fused variant of the Triton kernels (MOE_LORA_KERNELS) is a GPU figure, but of other kernels
    assert "triton_fused kernels, which the ranking does not price" in measurement_problem(
        simulated=False, kernel_path="triton_fused", recipe=recipe, run_model=QWEN_35B)
    assert "simulated" in measurement_problem(simulated=True, kernel_path="triton", recipe=recipe, run_model=QWEN_35B)


def test_it_tells_on_the_offers_page_that_the_simulated_marketplaces_figures_are_not_measurements(
        client, member, market, settings):
    from fleet.offers.refresh import refresh_offers

    settings.SIMULATOR_ENABLED = True
    refresh_offers()
    client.force_login(member)
    body = client.get("/offers/").content.decode()
    assert 'id="simulated-note"' in body and "never recorded as measurements" in body
