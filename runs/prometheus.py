"""The fleet in Prometheus' text format at /metrics, behind its own bearer token (METRICS_TOKEN) instead of a login."""

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from fleet.instances import ledger
from fleet.models import Instance
from runs.models import Run
from runs.run_data import latest_step_annotations


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    return "NaN" if value is None else repr(float(value))


def exposition(now) -> str:
    """The fleet in Prometheus' text format: instances and runs by state, the spend rate, and each active run's
    latest step time and tokens/s."""
    lines = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict, object]]):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")

    instances = dict(Instance.objects.values_list("state").annotate(n=Count("id")).order_by())
    gauge("fleet_instances", "Instances by state.",
          [({"state": s}, instances.get(s, 0)) for s, _ in Instance.State.choices])
    account = ledger.account_cost(now)
    gauge("fleet_spend_usd_per_hour", "What every billing instance costs per hour right now.",
          [({}, account.burn_usd_per_hour)])
    gauge("fleet_spend_cap_usd_per_hour", "The spend cap per hour (0: off).", [({}, settings.SPEND_CAP_USD_PER_HOUR)])
    gauge("fleet_spend_this_hour_usd", "Spent since the start of this hour (UTC).", [({}, account.this_hour_usd)])
    runs_by_state = dict(Run.objects.values_list("state").annotate(n=Count("id")).order_by())
    gauge("fleet_runs", "Training runs by state.", [({"state": s}, runs_by_state.get(s, 0)) for s, _ in
                                                    Run.State.choices])
    active = list(Run.objects.filter(state__in=Run.ACTIVE_STATES).annotate(**latest_step_annotations())
                  .values("pk", "name", "current_phase", "current_step", "last_step_s", "last_tokens_per_s",
                          "current_instance__gpu_name"))
    samples = [({"run": r["pk"], "name": r["name"], "gpu": r["current_instance__gpu_name"] or ""}, r) for r in active]
    gauge("fleet_run_step_seconds", "Each active run's latest step time.",
          [(labels, r["last_step_s"]) for labels, r in samples if r["last_step_s"] is not None])
    gauge("fleet_run_tokens_per_second", "Each active run's latest tokens per second.",
          [(labels, r["last_tokens_per_s"]) for labels, r in samples if r["last_tokens_per_s"] is not None])
    gauge("fleet_run_phase", "Each active run's current phase.",
          [(labels, r["current_phase"]) for labels, r in samples])
    gauge("fleet_run_step", "Each active run's current step in its phase.",
          [(labels, r["current_step"]) for labels, r in samples])
    return "\n".join(lines) + "\n"


@login_not_required
@require_GET
def prometheus_metrics(request):
    """Token-protected instead of a login: `Authorization: Bearer <METRICS_TOKEN>`; refused while no token is set."""
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse("Metrics are off: set METRICS_TOKEN to turn them on.\n", status=403,
                            content_type="text/plain")
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
        return HttpResponse("A valid bearer token is required.\n", status=401, content_type="text/plain",
                            headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    return HttpResponse(exposition(timezone.now()), content_type="text/plain; version=0.0.4; charset=utf-8")

