"""The run page in a real browser: Debian's Chromium driven by Playwright against the app on a live port."""

from pathlib import Path

import pytest

from tests.browser.conftest import chromium, log_in as sign_in, needs_chromium, wait_until

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHARTS = {
    "timeline": {"phase 0 · cpt", "phase 1 · sft", "phase 2 · dpo", "box · 1× H200 · healthy-box0",
                 "box · 1× RTX PRO 6000 · healthy-box1", "host lost / hung"},
    "step-time": {"1× H200 · healthy-box0", "1× RTX PRO 6000 · healthy-box1"},
    "tokens": {"1× H200 · healthy-box0", "1× RTX PRO 6000 · healthy-box1"},
    "loss": {"0 · cpt", "1 · sft", "2 · dpo"},
    "grad-norms": {"routed · cpt", "attention · cpt", "routed · sft", "attention · sft", "routed · dpo",
                   "attention · dpo"},
    "b-matrices": {"B norm · cpt", "B at zero · cpt", "B norm · sft", "B at zero · sft", "B norm · dpo",
                   "B at zero · dpo"},
    "cost-per-step": {"$/1k steps · 1× H200 · healthy-box0", "$/1k steps · 1× RTX PRO 6000 · healthy-box1"},
    "cost": {"cost so far", "budget"},
    "router": {"max/mean · cpt", "idle experts · cpt", "max/mean · sft", "idle experts · sft", "max/mean · dpo",
               "idle experts · dpo"},
    **{f"router-load-{p}": {"share of the layer's tokens"} for p in range(3)},
}
EVEN = [[3, 2, 4, 1], [2, 2, 3, 3]]  # every expert of both layers got tokens
IDLE = [[5, 3, 2, 0], [6, 4, 0, 0]]  # layer 0 expert 3, layer 1 experts 2 and 3 got none

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def seeded(member):
    from tests.runs.seeding import seed_run

    from runs.models import RouterLoad

    healthy, broken = seed_run("healthy", created_by=member), seed_run("broken", zero_routed_phase=1, created_by=member)
    for run in (healthy, broken):  # each phase's newest interval of the router's load, as a box posts it
        for phase in run.phases.all():
            counts = IDLE if run is broken and phase.index == 1 else EVEN
            RouterLoad.objects.create(run=run, phase=phase.index, step=phase.steps, at=run.created_at, counts=counts)
    return healthy, broken


@pytest.fixture
def browser(live_server, seeded):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        yield browser


def log_in(page, live_server):
    sign_in(page, live_server, "member")


def rendered_traces(page) -> dict[str, list[str]]:
    wait_until(page, "document.querySelectorAll('.js-plotly-plot').length >= 8", timeout_ms=20_000)
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(
        el => [el.dataset.chart, (el.data || []).map(t => t.name)]))""")


def test_it_renders_every_chart_with_named_traces_and_warns_only_for_zero_routed_gradients(
        live_server, seeded, browser):
    healthy, broken = seeded
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_server)

    page.goto(f"{live_server.url}/runs/{healthy.pk}/")
    traces = rendered_traces(page)
    assert set(traces) == set(CHARTS)
    for chart, names in CHARTS.items():
        assert all(traces[chart]), f"{chart} has a trace without a name: {traces[chart]}"
        assert set(traces[chart]) == names, chart
    page.wait_for_selector("#run-figures")
    assert page.locator("#zero-gradient-warning").count() == 0
    assert page.locator("#idle-experts-warning").count() == 0
    assert "Run finished" in page.locator("[data-chart-status]").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "run_page.png"), full_page=True)

    page.goto(f"{live_server.url}/runs/{broken.pk}/")
    rendered_traces(page)
    warning = page.locator("#zero-gradient-warning")
    warning.wait_for()
    assert "Phase 1 (sft)" in warning.inner_text()
    assert warning.evaluate("el => getComputedStyle(el).color") == "rgb(180, 35, 24)"  # the product's red
    idle = page.locator("#idle-experts-warning")
    assert "Phase 1 (sft): 3 of 8 routed experts got no token" in idle.inner_text()
    assert "layer 0: expert 3; layer 1: experts 2, 3" in idle.inner_text()
    assert idle.evaluate("el => getComputedStyle(el).color") == "rgb(180, 35, 24)"
    heatmap = page.locator('[data-chart="router-load-1"]')
    assert heatmap.evaluate("el => el.data.map(t => t.type)") == ["heatmap", "scatter"]
    assert heatmap.evaluate("el => el.data[1].x") == [3, 2, 3]  # the experts with no token, crossed out
    assert heatmap.locator(".hm, .heatmaplayer image, image").count() >= 1  # the cells drawn
    page.screenshot(path=str(ARTIFACTS / "run_page_zero_gradient.png"), full_page=True)

    page.goto(f"{live_server.url}/runs/compare/")
    wait_until(page, "document.querySelectorAll('.js-plotly-plot').length >= 3", timeout_ms=20_000)
    compare = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(
        el => (el.data || []).map(t => t.name))""")
    assert all(names == ["triton kernels"] for names in compare), compare
    page.screenshot(path=str(ARTIFACTS / "compare_page.png"), full_page=True)
    assert errors == []
