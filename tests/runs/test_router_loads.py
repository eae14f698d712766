"""The router's load from the box to the run page: the API stores a load matrix beside its step and refuses a
malformed one with a 422 (the agent then sends the steps without it), each phase keeps its newest intervals, and the
chart data draws a heatmap per phase and names the experts that got no token."""

import json
import time

import httpx
import plotly.graph_objects as go
import pytest
from django.test import Client
from django.urls import reverse

from config.wsgi import application
from runs import router_loads
from runs.models import MetricPoint, RouterLoad
from tests.runs.conftest import put_on_a_box
from tests.runs.test_agent_api_strict import _wsgi_connections_kept
from training.agent.dashboard import Api
from training.agent.metrics import forward_metrics
from training.metric_fields import ROUTER_MAX_COUNT, ROUTER_MAX_EXPERTS, ROUTER_MAX_LAYERS

pytestmark = pytest.mark.django_db
API = "/api/agent/v1"
LOAD = [[5, 3, 0, 4], [6, 6, 0, 0]]  # 2 MoE layers x 4 experts; layer 0 expert 2 and layer 1 experts 2, 3 got none


def _point(step=1, **fields):
    return {"phase": 0, "step": step, "loss": 2.5, "lr": 1e-3, "step_s": 0.5, "routed_b_zero": 0, **fields}


def _post(run, points):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    return client.post(API + "/metrics", json.dumps({"points": points}), content_type="application/json")


def test_a_load_matrix_is_stored_beside_its_step(launched):
    run = launched()
    response = _post(run, [_point(1), _point(2, router_load=LOAD, router_max_mean=2.0, router_idle_experts=3)])
    assert response.status_code == 200, response.content
    load = RouterLoad.objects.get()
    assert (load.run_id, load.phase, load.step, load.counts) == (run.pk, 0, 2, LOAD)
    point = MetricPoint.objects.get(step=2)
    assert (point.router_max_mean, point.router_idle_experts) == (2.0, 3)
    # Sent again (a resumed box trains the step again): the matrix is replaced, not doubled.
    assert _post(run, [_point(2, router_load=[[1, 1, 1, 1], [2, 2, 0, 0]])]).status_code == 200
    assert RouterLoad.objects.get().counts == [[1, 1, 1, 1], [2, 2, 0, 0]]


@pytest.mark.parametrize("bad, why", [
    ([[1, 2, 3], [1, 2]], "rows of two widths"),
    ([], "no layer"),
    ([[]], "a layer of no expert"),
    ([[1, -1]], "a negative count"),
    ([[1.5, 2]], "a fraction"),
    ([[1.0, 2]], "a float"),
    ([[True, 2]], "a boolean"),
    ([["3", 2]], "a string"),
    ([[None, 2]], "a null"),
    ([[ROUTER_MAX_COUNT + 1, 2]], "a count too large"),
    ([[1] * (ROUTER_MAX_EXPERTS + 1)], "too many experts"),
    ([[1]] * (ROUTER_MAX_LAYERS + 1), "too many layers"),
    ([1, 2, 3], "not a matrix"),
    ({"0": [1, 2]}, "an object"),
])
def test_a_malformed_matrix_is_refused_with_a_422_naming_it(launched, bad, why):
    run = launched()
    response = _post(run, [_point(1), _point(2, router_load=bad)])
    assert response.status_code == 422, why
    assert "router_load" in json.dumps(response.json()["detail"]), why
    assert not RouterLoad.objects.exists() and not MetricPoint.objects.exists()


def test_nan_or_infinity_in_a_matrix_is_refused(launched):
    run = launched()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {put_on_a_box(run)}")
    for value in ("NaN", "Infinity", "-Infinity"):
        body = '{"points": [{"phase": 0, "step": 1, "router_load": [[1, VALUE]]}]}'.replace("VALUE", value)
        response = client.post(API + "/metrics", body, content_type="application/json")
        assert response.status_code == 422, value
    assert not RouterLoad.objects.exists()


def test_the_agent_keeps_the_steps_of_a_post_whose_matrix_is_refused(launched, tmp_path):
    run = launched()
    api = Api("http://testserver/api/agent/v1/", put_on_a_box(run), attempts=1)
    api.http = httpx.Client(base_url=api.http.base_url, headers=api.http.headers,
                            transport=httpx.WSGITransport(app=application))
    path = tmp_path / "metrics.jsonl"
    records = [{"phase": 0, "step": 1, "time": time.time(), "loss": 2.0},
               {"phase": 0, "step": 2, "time": time.time(), "loss": 1.9, "router_load": [[1, -4]],
                "router_max_mean": 1.5, "router_idle_experts": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with _wsgi_connections_kept():
        assert forward_metrics(api, path, 0, 100) == path.stat().st_size
    assert sorted(MetricPoint.objects.values_list("step", flat=True)) == [1, 2]
    assert MetricPoint.objects.get(step=2).router_max_mean == 1.5
    assert not RouterLoad.objects.exists()


def test_each_phase_keeps_its_newest_intervals_only(launched, monkeypatch):
    monkeypatch.setattr(router_loads, "KEEP_PER_PHASE", 2)
    run = launched()
    for step in range(1, 4):
        assert _post(run, [_point(step, router_load=[[step, 1]])]).status_code == 200
    assert list(RouterLoad.objects.order_by("step").values_list("step", flat=True)) == [2, 3]
    assert router_loads.latest_per_phase(run)[0].counts == [[3, 1]]


@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)
    return client


def test_the_chart_data_draws_a_heatmap_per_phase_and_names_the_idle_experts(launched, logged_in):
    run = launched()
    assert _post(run, [_point(1, router_load=[[1, 1, 1, 1], [1, 1, 1, 1]], router_max_mean=1.0,
                              router_idle_experts=0),
                       _point(2, router_load=LOAD, router_max_mean=2.0, router_idle_experts=3)]).status_code == 200
    payload = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    heatmaps = {f["id"]: f for f in payload["figures"] if f["id"].startswith("router-load-")}
    assert set(heatmaps) == {f"router-load-{p.index}" for p in run.phases.all()}
    figure = heatmaps["router-load-0"]
    go.Figure(data=figure["data"], layout=figure["layout"])  # plotly's own schema takes it
    cells = figure["data"][0]
    assert cells["type"] == "heatmap" and cells["customdata"] == LOAD
    assert cells["z"][0] == pytest.approx([5 / 12, 3 / 12, 0, 4 / 12], abs=1e-5)
    crossed = figure["data"][1]
    assert list(zip(crossed["y"], crossed["x"], strict=True)) == [(0, 2), (1, 2), (1, 3)]
    others = [f for i, f in heatmaps.items() if i != "router-load-0"]
    assert others and all(f.get("empty") for f in others)  # phases not reached yet say so
    balance = next(f for f in payload["figures"] if f["id"] == "router")
    assert [2.0] == [y for t in balance["data"] if t["name"].startswith("max/mean") for y in t["y"] if y == 2.0]
    summary = payload["summary_html"]
    assert 'id="idle-experts-warning"' in summary
    assert "3 of 8 routed experts got no token in the interval ending at step 2" in summary
    assert "layer 0: expert 2; layer 1: experts 2, 3" in summary


def test_the_page_has_no_warning_while_every_expert_gets_tokens(launched, logged_in):
    run = launched()
    assert _post(run, [_point(1, router_load=[[1, 2], [3, 4]])]).status_code == 200
    payload = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    assert "idle-experts-warning" not in payload["summary_html"]
    page = logged_in.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert 'data-chart="router-load-0"' in page and 'data-chart="router"' in page
