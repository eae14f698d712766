import csv
import io
import json
import re
from decimal import Decimal

import plotly.graph_objects as go
import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.models import Alert
from runs.models import Run
from tests.runs.seeding import seed_run

@pytest.fixture
def logged_in(client, operator):
    client.force_login(operator)  # the seeded runs are no one's: an operator's to see
    return client


@pytest.mark.django_db
def test_it_serves_chart_data_with_named_traces(logged_in):
    run = seed_run()
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    assert body["points"] == 110 and body["active"] is False and body["state"] == "finished"
    ids = [f["id"] for f in body["figures"]]
    assert ids == ["timeline", "step-time", "loss", "grad-norms", "b-matrices", "tokens", "router", "cost",
                   "cost-per-step", "router-load-0", "router-load-1", "router-load-2"]
    for figure in body["figures"]:
        if figure["id"].startswith("router-load-"):  # the seeded run reported no router load: said in words
            assert figure["empty"] and not figure["data"]
            continue
        assert figure["data"], figure["id"]
        assert all(t["name"] for t in figure["data"]), figure["id"]
    by_id = {f["id"]: f for f in body["figures"]}
    assert [t["name"] for t in by_id["loss"]["data"]] == ["0 · cpt", "1 · sft", "2 · dpo"]
    assert [t["name"] for t in by_id["step-time"]["data"]] == ["1× H200 · qwen3-30b-sft-box0",
                                                             "1× RTX PRO 6000 · qwen3-30b-sft-box1"]
    assert by_id["grad-norms"]["layout"]["yaxis"]["type"] == "log"
    assert "host lost / hung" in [t["name"] for t in by_id["timeline"]["data"]]
    assert any(s.get("label", {}).get("text") == "host change" for s in by_id["step-time"]["layout"]["shapes"])
    assert body["warnings"] == [] and "zero-gradient-warning" not in body["summary_html"]


@pytest.mark.django_db
def test_a_hosts_words_reach_the_hover_labels_as_text(logged_in):
    # Plotly renders <a href> in hover labels and fills %{...} in templates: a host's message may do neither.
    run = seed_run()
    run.events.filter(kind="host_lost").update(message='<a href="https://evil.example">re-login</a> %{y}')
    run.attempts.update(end_reason="<b>host</b> %{x}")
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    timeline = {t["name"]: t for t in next(f for f in body["figures"] if f["id"] == "timeline")["data"]}
    (restart,) = timeline["host lost / hung"]["text"]
    assert "<a" not in restart and "&lt;a href" in restart and "%{y}" not in restart
    ended = [t["hovertemplate"] for name, t in timeline.items() if name.startswith("box · ")]
    assert any("&lt;b&gt;host&lt;/b&gt;" in h for h in ended) and not any("%{x}" in h for h in ended)


@pytest.mark.django_db
def test_it_warns_of_the_phase_with_zero_routed_gradients(logged_in):
    run = seed_run(zero_routed_phase=1)
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    assert len(body["warnings"]) == 1 and body["warnings"][0].startswith("Phase 1 (sft)")
    assert 'id="zero-gradient-warning"' in body["summary_html"] and "Phase 1 (sft)" in body["summary_html"]
    grads = next(f for f in body["figures"] if f["id"] == "grad-norms")
    assert any(s.get("label", {}).get("text") == "routed gradient = 0" for s in grads["layout"]["shapes"])


@pytest.mark.django_db
def test_it_projects_an_active_run(logged_in):
    run = seed_run(state="training")
    Run.objects.filter(pk=run.pk).update(current_phase=1, current_step=10)
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    assert body["active"] is True and body["refresh_s"] > 0
    assert "Projected total" in body["summary_html"] and "Projected finish" in body["summary_html"]
    cost = next(f for f in body["figures"] if f["id"] == "cost")
    assert [t["name"] for t in cost["data"]] == ["cost so far", "projected", "budget"]


@pytest.mark.django_db
def test_it_renders_the_run_page_with_its_chart_containers(logged_in):
    run = seed_run()
    body = logged_in.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert reverse("run_chart_data", args=[run.pk]) in body and reverse("run_metrics_csv", args=[run.pk]) in body
    assert "vendor/plotly.min.js" in body and "js/run-charts.js" in body
    for chart in ("timeline", "step-time", "loss", "grad-norms", "b-matrices", "tokens", "cost", "cost-per-step"):
        assert f'data-chart="{chart}"' in body


@pytest.mark.django_db
def test_it_streams_every_point_as_csv(logged_in):
    run = seed_run()
    response = logged_in.get(reverse("run_metrics_csv", args=[run.pk]))
    assert response.streaming and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 110
    assert rows[0]["phase"] == "0" and rows[0]["step"] == "1" and rows[0]["gpu"] == "H200"
    assert rows[-1]["box"] == "qwen3-30b-sft-box1" and float(rows[-1]["step_s"]) == 55.0


@pytest.mark.django_db
def test_it_compares_runs_and_gpu_models(logged_in):
    seed_run()
    body = logged_in.get(reverse("run_compare")).content.decode()
    assert 'id="compare-gpus"' in body and 'id="compare-runs"' in body and 'id="calibration"' in body
    assert "1× H200" in body and "1× RTX PRO 6000" in body
    assert "30.00 s" in body and "55.00 s" in body  # steady state: the slow first steps are left out
    assert "$10.00" in body  # 1,000 steps of 30 s on the H200 at $1.20/h
    assert 'id="figures-data"' in body and "triton kernels" in body
    drawn = json.loads(re.search(r'<script id="figures-data" type="application/json">(.*?)</script>', body,
                                 re.S).group(1))
    for figure in drawn:  # as plotly's own schema reads them: a misspelt attribute raises
        go.Figure({"data": figure["data"], "layout": figure["layout"]})


@pytest.mark.django_db
def test_it_shows_an_empty_comparison(logged_in):
    body = logged_in.get(reverse("run_compare")).content.decode()
    assert "No run has reported steady-state steps yet." in body


@pytest.mark.django_db
def test_it_lists_runs_with_step_time_cost_and_projection(logged_in):
    run = seed_run(state="training")
    Run.objects.filter(pk=run.pk).update(current_phase=1, current_step=10)
    body = logged_in.get(reverse("runs")).content.decode()
    for column in ("Step time", "$/1k steps", "Cost so far", "Projected total", "ETA"):
        assert f"<th>{column}</th>" in body
    # The median of the newest steps (the phase's slow first step does not move it), 1,000 of them at $1.05/h
    assert "55.00 s" in body and "$16.04" in body
    assert "sft · 10" in body


@pytest.mark.django_db
def test_it_shows_spend_against_the_cap_runs_and_alerts_on_the_dashboard(logged_in, settings):
    settings.SPEND_CAP_USD_PER_HOUR = Decimal("2")
    run = seed_run(state="training")
    Alert.objects.create(kind=Alert.Kind.RUN_FAILED, message="Run other failed: budget", created_at=timezone.now())
    body = logged_in.get(reverse("dashboard")).content.decode()
    assert 'id="spend-cap"' in body and "$1.05/h of a $2.00/h cap" in body and "53%" in body
    assert 'id="run-states"' in body and f'state-{run.state}">{run.state}</span> 1' in body
    assert "Run other failed: budget" in body


@pytest.mark.django_db
def test_it_says_when_the_spend_cap_is_off(logged_in, settings):
    settings.SPEND_CAP_USD_PER_HOUR = Decimal("0")
    body = logged_in.get(reverse("dashboard")).content.decode()
    assert "no spend cap" in body and "No alerts yet." in body


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["run_chart_data", "run_metrics_csv", "run_detail"])
def test_it_sends_anonymous_visitors_to_login(client, name):
    run = seed_run()
    response = client.get(reverse(name, args=[run.pk]))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_sends_anonymous_visitors_from_the_comparison_to_login(client):
    response = client.get(reverse("run_compare"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_answers_404_for_an_unknown_run(logged_in):
    assert logged_in.get(reverse("run_chart_data", args=[999999])).status_code == 404
    assert logged_in.get(reverse("run_metrics_csv", args=[999999])).status_code == 404


@pytest.mark.django_db
def test_it_refuses_metrics_while_no_token_is_set(client, settings):
    settings.METRICS_TOKEN = ""
    response = client.get(reverse("prometheus_metrics"), HTTP_AUTHORIZATION="Bearer ")
    assert response.status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic c2VjcmV0LXRva2Vu", "secret-token"])
def test_it_refuses_metrics_without_the_right_token(client, settings, header):
    settings.METRICS_TOKEN = "secret-token"
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.get(reverse("prometheus_metrics"), **extra)
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert b"fleet_" not in response.content


@pytest.mark.django_db
def test_it_exposes_fleet_and_run_metrics_to_prometheus(client, settings):
    settings.METRICS_TOKEN = "secret-token"
    settings.SPEND_CAP_USD_PER_HOUR = Decimal("12")
    run = seed_run(name='odd "name"', state="training")
    response = client.get(reverse("prometheus_metrics"), HTTP_AUTHORIZATION="Bearer secret-token")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert "# TYPE fleet_instances gauge" in text
    assert 'fleet_instances{state="running"} 1.0' in text and 'fleet_instances{state="destroyed"} 1.0' in text
    assert "fleet_spend_usd_per_hour 1.05" in text and "fleet_spend_cap_usd_per_hour 12.0" in text
    assert 'fleet_runs{state="training"} 1.0' in text
    labels = f'run="{run.pk}",name="odd \\"name\\"",gpu="RTX PRO 6000"'
    assert f"fleet_run_step_seconds{{{labels}}} 55.0" in text
    assert f"fleet_run_tokens_per_second{{{labels}}} {65536 / 55.0!r}" in text


@pytest.mark.django_db
def test_a_marketplaces_gpu_name_and_a_boxs_kernel_path_reach_legends_and_axes_as_text(logged_in):
    # Plotly draws <a href> in legend and tick text too: a GPU name could put a phishing link on the run's charts.
    from fleet.models import Instance
    from runs import chart_views

    run = seed_run()
    link = '<a href="https://evil.example/login">re-login</a>'
    Instance.objects.filter(pk__in=run.attempts.values("instance_id")).update(gpu_name=link)
    body = logged_in.get(reverse("run_chart_data", args=[run.pk])).json()
    names = [t["name"] for f in body["figures"] for t in f["data"]]
    assert any("&lt;a href" in name for name in names) and not any("<a" in name for name in names)
    figure = chart_views._bar_figure("c", "Step time", "s", [{"kernel_path": link, "num_gpus": 1, "gpu_model": link,
                                                            "step_s": 1.0}], "step_s")
    (bar,) = figure["data"]
    assert "<a" not in bar["name"] and not any("<a" in x for x in bar["x"])
