import yaml
from django.conf import settings
from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from fleet import demo
from fleet.access import boxes_for, require_permission
from fleet.inference.forms import ServeAdapterForm
from runs.run_data import projections
from runs import evaluation_views, launch as launching, serving, sharing, wording
from runs.forms import LaunchForm
from runs.models import Run


def require_launch_permission(user) -> None:
    require_permission(user, "runs.launch_run")


def run_list(request):
    now = timezone.now()
    runs = list(sharing.runs_for(request.user, Run.objects.select_related("current_instance")
                                                   .prefetch_related("phases"))[:200])
    projected = projections(runs, now)
    for run in runs:
        run.projection = projected[run.pk]
        run.phase_name = next((p.name for p in run.phases.all() if p.index == run.current_phase), "")
    template = "runs/_run_table.html" if request.headers.get("HX-Request") else "runs/run_list.html"
    return render(request, template, {"runs": runs, "now": now})


def run_launch(request):
    require_launch_permission(request.user)
    form = LaunchForm(request.POST or None, request.FILES or None, initial={
        "name": "tiny-demo", "recipe": yaml.safe_dump(launching.demo_recipe(), sort_keys=False, width=110),
        "bucket": str(settings.DATA_DIR / "checkpoints") if settings.LOCAL_BUCKETS else "",
        "budget_usd": "5.00", "max_restarts": 3})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            run = launching.launch(name=data["name"], recipe=data["recipe"], bucket=data["bucket"],
                                   budget_usd=data["budget_usd"], max_restarts=data["max_restarts"],
                                   profile=data["profile"], user=request.user, uploads=data["data_files"],
                                   disk_gb=data["disk_gb"], volume=form.volume())
        except launching.LaunchError as exc:
            form.add_error(exc.field, str(exc))
        else:
            messages.success(request, f"Run {run.name} launched: the supervisor rents its box now.")
            return redirect("run_detail", pk=run.pk)
    return render(request, "runs/run_launch.html", {"form": form})


def run_detail(request, pk):
    run = sharing.run_or_404(request.user, pk, Run.objects.select_related("current_instance", "profile"))
    phases = list(run.phases.select_related("dataset", "eval_dataset"))
    sharing.as_seen([d for p in phases for d in (p.dataset, p.eval_dataset) if d is not None], request.user)
    context = {"run": run, "status": wording.describe(run, phases),
               "projection": projections([run], timezone.now())[run.pk],
               "phases": phases, "attempts": run.attempts.select_related("instance"), "events": run.events.all()[:200],
               "checkpoints": run.checkpoints.all()[:50], **_box(request.user, run),
               **evaluation_views.page_context(request.user, run)}
    if request.headers.get("HX-Request"):  # one of the page's three live regions
        template = LIVE_PARTS.get(request.GET.get("part", ""), "runs/_run_state.html")
    else:
        template = "runs/run_detail.html"
    return render(request, template, context)


LIVE_PARTS = {"history": "runs/_run_history.html", "box": "runs/_run_box.html"}


def _box(user, run: Run) -> dict:
    """The run's current box for those who may see it (access.boxes_for), with the simulated marketplace's commands
    that kill or hang it while the run is active (on the embedded default)."""
    box = run.current_instance
    if box is None or not boxes_for(user).filter(pk=box.pk).exists():
        return {"box": None, "box_commands": {}}
    return {"box": box, "box_commands": demo.box_commands(box) if run.is_active else {}}


@require_http_methods(["GET", "POST"])
def run_cancel(request, pk):
    """GET asks to confirm (cancelling destroys the run's box); POST cancels."""
    require_launch_permission(request.user)
    run = sharing.run_or_404(request.user, pk, Run.objects.select_related("current_instance"))
    if request.method == "GET" or not run.is_active:
        if not run.is_active:
            messages.info(request, f"Run {run.name} #{run.pk} is {run.state} already.")
            return redirect("run_detail", pk=pk)
        return render(request, "runs/cancel_confirm.html", {"run": run})
    launching.cancel(run, user=request.user)
    messages.success(request, f"Run {run.name} #{run.pk} cancelled; the supervisor's next pass destroys its box.")
    return redirect("run_detail", pk=pk)


@require_http_methods(["GET", "POST"])
def run_serve(request, pk):
    """GET: the form that serves one of a finished run's adapters; POST: the inference model serving it."""
    require_permission(request.user, serving.PERMISSION)
    run = sharing.run_or_404(request.user, pk)
    adapters = {adapter.checkpoint.pk: adapter for adapter in serving.servable(run)}
    if not adapters:
        messages.error(request, serving.why_not(run))
        return redirect("run_detail", pk=pk)
    form = ServeAdapterForm(request.POST or None, adapters=[(k, a.label) for k, a in adapters.items()],
                            initial=serving.initial(run, next(iter(adapters.values()))))
    if request.method == "POST" and form.is_valid():
        try:
            model = serving.serve(run, adapters[form.cleaned_data["checkpoint"]], form.cleaned_data,
                                  user=request.user)
        except serving.NameTaken as exc:
            form.add_error("name", str(exc))
        else:
            messages.success(request, f"{model.name}: {model.desired_replicas} replica(s) of {model.adapter_source} "
                                      f"on {model.base_model}; the fleet rents them now.")
            return redirect("inference")
    verdict = run.evaluations.filter(state="finished").order_by("-number").first()  # shown beside the form
    return render(request, "runs/serve_adapter.html", {"run": run, "form": form, "evaluation": verdict},
                  status=400 if form.errors else 200)
