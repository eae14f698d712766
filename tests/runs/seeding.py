"""A seeded run for the page, chart and browser tests: phases on two boxes, a host change, a point per step."""

import math
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from fleet.models import CostSegment, Instance
from runs.models import MetricPoint, Phase, Run, RunAttempt, RunEvent

PHASES = (("cpt", "cpt", 40), ("sft", "sft", 40), ("dpo", "dpo", 30))
ROUTED_B = 96


def seed_run(name="qwen3-30b-sft", *, phases=PHASES, zero_routed_phase=None, state="finished", now=None,
             step_s=(30.0, 55.0), created_by=None) -> Run:
    """A run of a few phases on two boxes (the first lost halfway), with a metric point per step, cost segments and
    the events of the restart; `zero_routed_phase` trains with the routed-expert gradient at exactly zero."""
    now = now or timezone.now()
    total = sum(steps for _, _, steps in phases)
    start = now - timedelta(seconds=sum(step_s) / 2 * total + 600)
    run = Run.objects.create(name=name, recipe={}, bucket="s3://bucket/runs", budget_usd=Decimal("40"),
                             token_nonce="n", state=state, created_by=created_by, created_at=start, started_at=start,
                             current_phase=len(phases) - 1, current_step=phases[-1][2],
                             finished_at=None if state in Run.ACTIVE_STATES else now)
    for i, (phase_name, kind, steps) in enumerate(phases):
        Phase.objects.create(run=run, index=i, name=phase_name, kind=kind, steps=steps)
    boxes = []
    for i, (gpu, rate) in enumerate((("H200", Decimal("1.20")), ("RTX PRO 6000", Decimal("1.05")))):
        boxes.append(Instance.objects.create(provider="vast", idempotency_key=f"{name}-{i}", label=f"{name}-box{i}",
                                             state="destroyed", purpose="training", offer_id=str(i), gpu_name=gpu,
                                             machine_id=f"m{i}", image="img", disk_gb=250, requested_at=start,
                                             usd_per_hour=rate))
    switch = total // 2
    at, rows, g = start + timedelta(seconds=300), [], 0
    switch_at = None
    for p, (_, _, steps) in enumerate(phases):
        for step in range(1, steps + 1):
            box = 0 if g < switch else 1
            if g == switch:
                switch_at, at = at, at + timedelta(seconds=300)
            seconds = step_s[box] * (1.6 if step == 1 else 1.0)
            at += timedelta(seconds=seconds)
            zero = p == zero_routed_phase
            rows.append(MetricPoint(
                run=run, phase=p, step=step, at=at, loss=2.5 * math.exp(-g / 40) + 0.4, lr=1e-4, step_s=seconds,
                tokens_per_s=65536 / seconds, grad_norm_routed=0.0 if zero else 0.3 + 0.01 * (step % 5),
                grad_norm_attention=1.1 + 0.02 * (step % 3), grad_norm_total=1.3,
                routed_b_norm=0.0 if zero else 0.02 * (g + 1), routed_b_zero=ROUTED_B if zero or g == 0 else 0,
                gpu_mem_gib=70.0, kernel_path="triton", instance=boxes[box]))
            g += 1
    MetricPoint.objects.bulk_create(rows)
    end = now if state not in Run.ACTIVE_STATES else None
    RunAttempt.objects.create(run=run, instance=boxes[0], started_at=start, ended_at=switch_at,
                              end_reason="No heartbeat from the box for 75 s.")
    RunAttempt.objects.create(run=run, instance=boxes[1], started_at=switch_at, ended_at=end)
    CostSegment.objects.create(instance=boxes[0], usd_per_hour=boxes[0].usd_per_hour, started_at=start,
                               ended_at=switch_at)
    CostSegment.objects.create(instance=boxes[1], usd_per_hour=boxes[1].usd_per_hour, started_at=switch_at,
                               ended_at=end)
    RunEvent.objects.create(run=run, at=switch_at, kind="host_lost", message="No heartbeat from the box for 75 s.")
    if state in Run.ACTIVE_STATES:
        Instance.objects.filter(pk=boxes[1].pk).update(state="running")
        Run.objects.filter(pk=run.pk).update(current_instance=boxes[1])
        run.refresh_from_db()
    return run
