"""The run's metrics.csv opens in a spreadsheet: text that a box or a marketplace chose never runs as a formula,
while every number, negative ones included, stays a number."""

import csv
import io

import pytest
from django.urls import reverse

from runs.models import MetricPoint
from tests.runs.seeding import seed_run

pytestmark = pytest.mark.django_db
HOSTILE = ['=HYPERLINK("x.io")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1"]  # 20 chars at most


def _rows(client, run) -> list[dict]:
    response = client.get(reverse("run_metrics_csv", args=[run.pk]))
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode(), newline="")))


def test_it_quotes_text_cells_that_start_like_a_formula(client, operator):
    run = seed_run()
    points = list(MetricPoint.objects.filter(run=run).order_by("phase", "step")[:len(HOSTILE)])
    box = points[0].instance
    box.label, box.gpu_name = HOSTILE[0], HOSTILE[3]
    box.save()
    for point, text in zip(points, HOSTILE, strict=True):
        point.kernel_path = text
        point.save()
    client.force_login(operator)  # the seeded run is no one's
    rows = _rows(client, run)
    assert [row["kernel_path"] for row in rows[:len(HOSTILE)]] == ["'" + text for text in HOSTILE]
    assert rows[0]["box"] == "'" + HOSTILE[0] and rows[0]["gpu"] == "'" + HOSTILE[3]
    assert rows[-1]["kernel_path"] == "triton"  # plain text stays as it was


def test_it_keeps_negative_numbers_numbers(client, operator):
    run = seed_run()
    MetricPoint.objects.filter(run=run, phase=0, step=1).update(loss=-0.25, lr=-1e-05)
    client.force_login(operator)  # the seeded run is no one's
    first = _rows(client, run)[0]
    assert (first["loss"], first["lr"]) == ("-0.25", "-1e-05")
    assert float(first["step_s"]) > 0 and first["step"] == "1"
