"""The Inference fleet page: each model's desired and live replicas, each serving box's last probes, and the desired
replica count for staff who may change inference models."""

import logging

from django import forms
from django.contrib import messages
from django.db import transaction
from django.db.models import Prefetch, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleet import enqueue
from fleet.inference.replicas import failing_threshold, model_states
from fleet.access import can, require_permission
from fleet.models import InferenceModel, Instance, ProbeResult

log = logging.getLogger(__name__)

PROBES_SHOWN = 5
CHANGE_MODELS = "fleet.change_inferencemodel"
MAX_DESIRED_REPLICAS = 100


class DesiredReplicasForm(forms.Form):
    desired_replicas = forms.IntegerField(min_value=0, max_value=MAX_DESIRED_REPLICAS)


def _serving_boxes():
    recent = ProbeResult.objects.order_by("-at", "-id")[:PROBES_SHOWN]
    return (Instance.objects.filter(Q(purpose="serving") | Q(serving_model__isnull=False),
                                    state__in=Instance.LIVE_STATES)
            .select_related("serving_model").prefetch_related(Prefetch("probes", queryset=recent, to_attr="recent"))
            .order_by("serving_model__name", "requested_at"))


def inference(request):
    now = timezone.now()
    states = model_states(now)
    context = {
        "models": [{"model": m, "live": s.live_replicas, "rented_today": s.rented_today,
                    "short": max(0, s.desired_replicas - s.live_replicas)} for m, s in states],
        "boxes": list(_serving_boxes()),
        "threshold": failing_threshold(),
        "probes_shown": PROBES_SHOWN,
        "now": now,
        "can_change": can(request.user, CHANGE_MODELS),
    }
    template = "fleet/_inference_fleet.html" if request.headers.get("HX-Request") else "fleet/inference.html"
    return render(request, template, context)


@require_POST
def set_desired_replicas(request, pk):
    require_permission(request.user, CHANGE_MODELS)
    model = get_object_or_404(InferenceModel, pk=pk)
    form = DesiredReplicasForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Desired replicas for {model.name}: 0 to {MAX_DESIRED_REPLICAS}.")
        return redirect("inference")
    before = model.desired_replicas
    model.desired_replicas = form.cleaned_data["desired_replicas"]
    model.save(update_fields=["desired_replicas"])
    log.info("%s set the desired replicas of %s from %s to %s", request.user.get_username(), model.name, before,
             model.desired_replicas)
    # Acted on at once rather than at the next beat tick; a broker that is down only delays it to that tick.
    transaction.on_commit(enqueue.maintain_inference_fleet, robust=True)
    messages.success(request, f"{model.name}: {model.desired_replicas} desired replica(s) (was {before}).")
    return redirect("inference")
