"""The Inference fleet page: each model's desired and live replicas, each serving box's last probes; adding a model
to serve for staff who may add inference models, and changing one (its desired replicas too) for staff who may
change them. A user sees and changes only their own models, an operator every one (fleet.access.owned)."""

import logging

from django.contrib import messages
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, Q
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from fleet import enqueue, hooks
from fleet.inference.forms import MAX_DESIRED_REPLICAS, DesiredReplicasForm, InferenceModelForm
from fleet.inference.replicas import failing_threshold, model_states
from fleet.access import can, is_operator, owned, owned_or_404, require_permission
from fleet.models import InferenceModel, Instance, ProbeResult

log = logging.getLogger(__name__)

PROBES_SHOWN = 5
ADD_MODELS = "fleet.add_inferencemodel"
CHANGE_MODELS = "fleet.change_inferencemodel"


def _serving_boxes(user):
    recent = ProbeResult.objects.order_by("-at", "-id")[:PROBES_SHOWN]
    # A serving box whose model is gone has no owner left: an operator's to see.
    serving = (Q(purpose="serving") | Q(serving_model__isnull=False) if is_operator(user)
               else Q(serving_model__created_by=user))
    return (Instance.objects.filter(serving, state__in=Instance.LIVE_STATES)
            .select_related("serving_model").prefetch_related(Prefetch("probes", queryset=recent, to_attr="recent"))
            .order_by("serving_model__name", "requested_at"))


def inference(request):
    now = timezone.now()
    visible = set(owned(InferenceModel.objects.all(), request.user).values_list("pk", flat=True))
    states = [(m, s) for m, s in model_states(now) if m.pk in visible]
    context = {
        "models": [{"model": m, "live": s.probed_replicas, "starting": s.starting_replicas,
                    "rented_today": s.rented_today, "short": max(0, s.desired_replicas - s.live_replicas)}
                   for m, s in states],
        "boxes": list(_serving_boxes(request.user)),
        "threshold": failing_threshold(),
        "probes_shown": PROBES_SHOWN,
        "now": now,
        "can_change": can(request.user, CHANGE_MODELS),
        "can_add": can(request.user, ADD_MODELS),
        # Trained adapters to serve, a run's promoted one first (runs registers them: fleet.hooks).
        "adapters": hooks.adapters_to_serve(request.user) if can(request.user, ADD_MODELS) else [],
    }
    template = "fleet/_inference_fleet.html" if request.headers.get("HX-Request") else "fleet/inference.html"
    return render(request, template, context)


@require_POST
def set_desired_replicas(request, pk):
    require_permission(request.user, CHANGE_MODELS)
    model = owned_or_404(InferenceModel.objects.all(), request.user, pk)
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


@require_http_methods(["GET", "POST"])
def add_model(request):
    require_permission(request.user, ADD_MODELS)
    return _model_form(request, InferenceModel(created_by=request.user))


@require_http_methods(["GET", "POST"])
def change_model(request, pk):
    require_permission(request.user, CHANGE_MODELS)
    return _model_form(request, owned_or_404(InferenceModel.objects.all(), request.user, pk))


def _model_form(request, model: InferenceModel):
    adding = model.pk is None
    form = InferenceModelForm(request.POST or None, instance=model)
    if request.method == "POST" and form.is_valid() and _saved(form):
        changed = ", ".join(form.changed_data) or "nothing"
        model = form.instance
        log.info("%s %s inference model %s (%s)", request.user.get_username(), "added" if adding else "changed",
                 model.name, changed)
        # The fleet follows at once rather than at the next beat tick; a broker that is down only delays it.
        transaction.on_commit(enqueue.maintain_inference_fleet, robust=True)
        messages.success(request, f"{model.name}: {'added' if adding else 'saved'}, {model.desired_replicas} desired "
                                  f"replica(s).")
        return redirect("inference")
    replicas = None if adding else next((state for m, state in model_states(timezone.now()) if m.pk == model.pk), None)
    return render(request, "fleet/inference_model.html", {"form": form, "model": model, "adding": adding,
                                                          "replicas": replicas}, status=400 if form.errors else 200)


def _saved(form: InferenceModelForm) -> bool:
    """Saves the form, or says on its name field why not when another model took the name since it was checked."""
    try:
        with transaction.atomic():  # a savepoint: a lost race leaves the request's transaction usable
            form.save()
    except IntegrityError:
        if not InferenceModel.objects.filter(name=form.cleaned_data["name"]).exclude(pk=form.instance.pk).exists():
            raise
        form.add_error("name", f"An inference model named {form.cleaned_data['name']} exists already.")
        return False
    return True
