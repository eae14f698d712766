"""The data set pages: each data set the user sees (runs.sharing) with its size and sha256, and one with what its
check measured."""

from django.db.models import Count, Q
from django.shortcuts import render

from runs import sharing
from runs.models import DataSet
from runs.sample_render import shown_sample


def dataset_list(request):
    runs = sharing.runs_for(request.user)
    found = (sharing.datasets_for(request.user, DataSet.objects.select_related("uploaded_by"))
             .annotate(runs=Count("phases__run", filter=Q(phases__run__in=runs), distinct=True))[:500])
    return render(request, "runs/dataset_list.html", {"datasets": sharing.as_seen(found, request.user)})


def dataset_detail(request, pk):
    dataset = sharing.as_seen([sharing.dataset_or_404(request.user, pk, DataSet.objects.select_related("uploaded_by"))],
                       request.user)[0]
    uses = (dataset.phases.filter(run__in=sharing.runs_for(request.user)).select_related("run")
            .order_by("-run__created_at", "index"))[:100]
    sample = shown_sample(dataset.report.get("sample") or {})  # cut again: an older row may hold one whole
    return render(request, "runs/dataset_detail.html", {"dataset": dataset, "report": dataset.report,
                                                        "sample": sample, "uses": uses})
