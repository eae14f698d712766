"""The data set pages: each data set the user sees (runs.sharing) with its size and sha256, and one with what its
check measured."""

from django.db.models import Count, Q
from django.shortcuts import render

from runs import sharing
from runs.models import DataSet, DataSetName
from runs.sample_render import shown_sample


def _as_seen(datasets, user) -> list:
    """Each set under the user's own newest name and uploader: a row shared through the same bytes keeps its first
    uploader's, which are theirs to see (an operator sees the row's own)."""
    datasets = list(datasets)
    if sharing.is_operator(user):
        for dataset in datasets:
            dataset.shown_name, dataset.shown_uploader = dataset.name, dataset.uploaded_by
        return datasets
    names = {}
    for dataset_id, name in (DataSetName.objects.filter(user=user, dataset__in=datasets)
                             .order_by("stored_at", "id").values_list("dataset_id", "name")):
        names[dataset_id] = name  # the newest wins
    for dataset in datasets:
        dataset.shown_name = names.get(dataset.pk, dataset.name)
        dataset.shown_uploader = dataset.uploaded_by if dataset.uploaded_by_id == user.pk else None
    return datasets


def dataset_list(request):
    runs = sharing.runs_for(request.user)
    found = (sharing.datasets_for(request.user, DataSet.objects.select_related("uploaded_by"))
             .annotate(runs=Count("phases__run", filter=Q(phases__run__in=runs), distinct=True))[:500])
    return render(request, "runs/dataset_list.html", {"datasets": _as_seen(found, request.user)})


def dataset_detail(request, pk):
    dataset = _as_seen([sharing.dataset_or_404(request.user, pk, DataSet.objects.select_related("uploaded_by"))],
                       request.user)[0]
    uses = (dataset.phases.filter(run__in=sharing.runs_for(request.user)).select_related("run")
            .order_by("-run__created_at", "index"))[:100]
    sample = shown_sample(dataset.report.get("sample") or {})  # cut again: an older row may hold one whole
    return render(request, "runs/dataset_detail.html", {"dataset": dataset, "report": dataset.report,
                                                        "sample": sample, "uses": uses})
