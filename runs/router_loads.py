"""The router's load a run's box reported (runs.models.RouterLoad): stored from the metric posts, the newest few
intervals of each phase kept, the latest of each phase read for the run page (docs/runs.md, "runs/router_loads.py")."""

from datetime import datetime

from django.db.models import Max, Q

from runs.models import RouterLoad, Run
from training.metric_fields import ROUTER_LOAD

KEEP_PER_PHASE = 100  # intervals; at 10 steps each, the last 1,000 steps of a phase
NAMED_AT_MOST = 24  # idle (layer, expert) pairs named one by one in a warning; the rest are counted


def store(run: Run, points: list[dict], now: datetime) -> int:
    """Stores the load matrix of every point that carries one (a step sent again replaces its matrix), then drops
    each phase's intervals beyond the newest KEEP_PER_PHASE; returns how many were stored."""
    latest = {(p["phase"], p["step"]): p for p in points if p.get(ROUTER_LOAD) is not None}
    if not latest:
        return 0
    RouterLoad.objects.bulk_create(
        [RouterLoad(run_id=run.pk, phase=phase, step=step, at=p.get("at") or now, counts=p[ROUTER_LOAD])
         for (phase, step), p in latest.items()],
        update_conflicts=True, unique_fields=["run", "phase", "step"], update_fields=["at", "counts"])
    for phase in {phase for phase, _ in latest}:
        old = RouterLoad.objects.filter(run=run, phase=phase).order_by("-step").values_list("pk", flat=True)
        RouterLoad.objects.filter(pk__in=list(old[KEEP_PER_PHASE:])).delete()
    return len(latest)


def latest_per_phase(run: Run) -> dict[int, RouterLoad]:
    """{phase index: its newest interval}, in two queries whatever the number of phases."""
    newest = RouterLoad.objects.filter(run=run).values("phase").order_by().annotate(step=Max("step"))
    wanted = Q(pk__in=[])
    for row in newest:
        wanted |= Q(phase=row["phase"], step=row["step"])
    return {load.phase: load for load in RouterLoad.objects.filter(run=run).filter(wanted)}


def idle_pairs(counts: list[list[int]]) -> list[tuple[int, int]]:
    """(layer, expert) of every expert that got no token."""
    return [(layer, expert) for layer, row in enumerate(counts) for expert, c in enumerate(row) if c == 0]


def idle_warning(phase: int, name: str, step: int, counts: list[list[int]]) -> str | None:
    """What the run page says about one phase's latest interval, or None when every expert got tokens."""
    idle = idle_pairs(counts)
    if not idle:
        return None
    by_layer: dict[int, list[int]] = {}
    for layer, expert in idle[:NAMED_AT_MOST]:
        by_layer.setdefault(layer, []).append(expert)
    named = "; ".join(f"layer {layer}: expert{'s' if len(experts) > 1 else ''} {', '.join(map(str, experts))}"
                      for layer, experts in by_layer.items())
    more = f" and {len(idle) - NAMED_AT_MOST} more" if len(idle) > NAMED_AT_MOST else ""
    total = sum(len(row) for row in counts)
    return (f"Phase {phase} ({name}): {len(idle)} of {total} routed experts got no token in the interval ending at "
            f"step {step} ({named}{more}); their LoRA cannot train while the router sends them nothing.")
