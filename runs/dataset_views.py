"""The data set pages: every stored data set with its size and sha256, and one with what its check measured."""

from django.db.models import Count
from django.shortcuts import get_object_or_404, render

from runs.models import DataSet
from runs.sample_render import shown_sample


def dataset_list(request):
    found = DataSet.objects.select_related("uploaded_by").annotate(runs=Count("phases__run", distinct=True))[:500]
    return render(request, "runs/dataset_list.html", {"datasets": found})


def dataset_detail(request, pk):
    dataset = get_object_or_404(DataSet.objects.select_related("uploaded_by"), pk=pk)
    runs = (dataset.phases.select_related("run").order_by("-run__created_at", "index"))[:100]
    sample = shown_sample(dataset.report.get("sample") or {})  # cut again: an older row may hold one whole
    return render(request, "runs/dataset_detail.html", {"dataset": dataset, "report": dataset.report,
                                                        "sample": sample, "uses": runs})
