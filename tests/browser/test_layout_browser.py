"""The pages at a desktop's and a phone's width in a real browser (Debian's Chromium driven by Playwright): nothing
scrolls sideways, nothing logs a console error (a missing favicon included), a run's charts either draw with
readable axes or say there are no steps yet, on a seeded database with a long run, a recovered run and a run that
has not trained yet."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.browser.conftest import chromium, log_in as sign_in, needs_chromium, wait_until

WIDTHS = (1400, 390)
UNBROKEN = "Traceback:/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/" + "x" * 220

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def seeded(operator):
    from fleet.alerts import notify
    from fleet.models import Alert, CostSegment, InferenceModel, Instance, InstanceEvent
    from runs.models import MetricPoint, Phase, Run, RunEvent
    from tests.runs.seeding import seed_run

    now = timezone.now()
    long_run = seed_run("qwen3-235b-a22b-five-phase-long-run", state="training", phases=(
        ("cpt", "cpt", 6000), ("sft", "sft", 6000), ("dpo", "dpo", 4000), ("kto", "kto", 2000),
        ("grpo", "grpo", 2000)), step_s=(0.5, 0.7))
    RunEvent.objects.create(run=long_run, at=now, kind="trainer_failed", message=UNBROKEN)
    # A CPU demo's prices (fractions of a cent per 1,000 steps) and gradient norms over several decades.
    MetricPoint.objects.filter(run=long_run, phase=0).update(grad_norm_routed=0.02)
    cheap = Instance.objects.filter(run_attempts__run=long_run)
    CostSegment.objects.filter(instance__in=cheap).update(usd_per_hour=Decimal("0.02"))
    cheap.update(usd_per_hour=Decimal("0.02"))
    recovered = seed_run("recovered")
    Run.objects.create(name="recovered", recipe={}, bucket="s3://bucket/runs", budget_usd=5, token_nonce="n",
                       state="failed", created_at=now)  # the same name: told apart by its #id
    box = recovered.attempts.first().instance
    Instance.objects.filter(pk=box.pk).update(provider_status="running", gpu_util_percent=93.0, ended_at=now,
                                              running_at=now - timedelta(hours=2), destroy_reason=UNBROKEN)
    InstanceEvent.objects.create(instance=box, at=now, kind="destroyed", message=UNBROKEN)
    fresh = Run.objects.create(name="fresh", recipe={}, bucket="s3://bucket/" + "deep/" * 40, budget_usd=5,
                               token_nonce="n", state="pending", created_at=now)
    Phase.objects.create(run=fresh, index=0, name="sft", kind="sft", steps=100)
    InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2")
    notify.create_endpoint(name="ops", url="https://hooks.example.com/services/T0/B0/" + "k" * 60, events=[],
                           slack=True)
    notify.raise_alert(Alert.Kind.RUN_FAILED, UNBROKEN, instance=box)
    return {"long": long_run, "recovered": recovered, "fresh": fresh, "box": box}


@pytest.fixture
def browser(live_server, seeded):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        yield browser


def pages(seeded) -> dict[str, str]:
    return {
        "dashboard": "/", "runs": "/runs/", "long run": f"/runs/{seeded['long'].pk}/",
        "recovered run": f"/runs/{seeded['recovered'].pk}/", "run with no steps": f"/runs/{seeded['fresh'].pk}/",
        "cancel": f"/runs/{seeded['long'].pk}/cancel/", "compare": "/runs/compare/",
        "destroyed instance": f"/instances/{seeded['box'].pk}/", "inference": "/inference/",
        "add inference model": "/inference/models/new/", "alerts": "/alerts/", "not found": "/runs/999999/",
    }


def log_in(page, live_server):
    sign_in(page, live_server, "operator")


def overflow(page) -> dict:
    """How far the page reaches past the window, and the widest elements that make it."""
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const wide = [...document.querySelectorAll('body *')].filter(el => el.getBoundingClientRect().right > width
            || el.scrollWidth > width).slice(0, 5)
            .map(el => el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className);
        return {scroll: document.documentElement.scrollWidth, width, wide};
    }""")


def wait_for_charts(page):
    wait_until(page, """() => [...document.querySelectorAll('[data-chart]')].every(
        el => el.dataset.rendered || el.dataset.empty)""", timeout_ms=30_000)


def tick_labels(page, chart: str, axis: str) -> list[str]:
    return page.evaluate(f"""() => [...document.querySelectorAll('[data-chart="{chart}"] .{axis}tick text')]
        .map(t => t.textContent)""")


@pytest.mark.parametrize("width", WIDTHS)
def test_it_lays_out_every_page_without_sideways_scrolling_or_console_errors(live_server, seeded, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}") if msg.type == "error" else None)
    log_in(page, live_server)
    for name, path in pages(seeded).items():
        errors_before = len(errors)
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == (404 if name == "not found" else 200), name
        if "run" in name and path.count("/") == 3:
            wait_for_charts(page)
        page.wait_for_load_state("networkidle")
        if name == "not found":  # the browser reports the page's own 404 status; anything else is an error
            errors[errors_before:] = [e for e in errors[errors_before:] if "404" not in e]
            assert page.locator("h1").inner_text() == "Not found"
            assert page.locator("header.top .brand").count() == 1  # the product's own page, styled
        measured = overflow(page)
        assert measured["scroll"] <= measured["width"], f"{name} at {width} px: {measured}"
    assert errors == []


def test_it_draws_readable_axes_and_says_when_there_are_no_steps(live_server, seeded, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    log_in(page, live_server)

    page.goto(f"{live_server.url}/runs/{seeded['fresh'].pk}/")
    wait_for_charts(page)
    empty = page.locator(".chart-empty")
    assert empty.count() == 8 and "No steps yet" in empty.first.inner_text()
    assert "2000" not in page.locator("#run-charts").inner_text()  # no default date axis
    assert page.locator("#run-now").inner_text().startswith("Waiting for a box")

    page.goto(f"{live_server.url}/runs/{seeded['long'].pk}/")
    wait_for_charts(page)
    assert page.locator(".chart-empty").count() == 0
    assert "TRAINING_PROBE_OK" not in page.content()
    assert "grpo (grpo, phase 5 of 5)" in page.locator("#run-progress").inner_text()
    # A log axis labels each tick with the number it stands for (not "5" for 0.005).
    ticks = page.evaluate("""() => document.querySelector('[data-chart="grad-norms"]')._fullLayout.yaxis._vals
        .map(t => [Math.pow(10, t.x), t.text])""")
    assert len(ticks) >= 3 and all(abs(float(text) - value) <= 0.01 * value for value, text in ticks), ticks
    # Money in plain decimals: no "$30µ"
    for chart in ("cost-per-step", "cost"):
        labels = tick_labels(page, chart, "y")
        assert labels and all(re.fullmatch(r"\$\d[\d,]*(\.\d+)?", label) for label in labels), (chart, labels)
    assert "1k steps" in page.locator("#run-figures").inner_text()

    page.goto(f"{live_server.url}/instances/{seeded['box'].pk}/")
    facts = page.locator("dl.facts").inner_text()
    assert "GPU 93%" not in facts and "Provider says" not in facts and "Destroyed" in facts

    page.goto(f"{live_server.url}/runs/")
    names = page.locator("#run-table tbody td:first-child").all_inner_texts()
    recovered = [n for n in names if n.startswith("recovered")]
    assert len(recovered) == 2 and len(set(recovered)) == 2, names


def test_it_asks_before_cancelling_a_run(live_server, seeded, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/runs/{seeded['long'].pk}/")
    page.click("text=Cancel the run")
    assert page.locator("h1").inner_text().startswith("Cancel qwen3-235b")
    page.click("text=Keep it running")
    page.click("text=Cancel the run")
    page.click("text=Yes, cancel the run")
    page.wait_for_selector(".message")
    assert "cancelled" in page.locator(".message").inner_text()
    assert page.locator("#run-state .state").inner_text() == "cancelled"


@pytest.fixture
def long_gpu_names(seeded):
    from fleet.models import Instance

    for i, box in enumerate(Instance.objects.filter(purpose="training").order_by("pk")):
        box.gpu_name = ("RTX PRO 6000 Blackwell Server Edition", "H100 NVL 94GB PCIe Gen5", "A100 SXM4 80GB")[i % 3]
        box.save(update_fields=["gpu_name"])


@pytest.mark.parametrize("width", WIDTHS)
def test_the_compare_charts_show_every_gpu_name_whole(live_server, seeded, long_gpu_names, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/runs/compare/")
    wait_until(page, "() => document.querySelectorAll('.xtick text').length > 0")
    clipped = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
        const edge = plot.getBoundingClientRect();
        return [...plot.querySelectorAll('.xtick text')].filter(label => {
            const box = label.getBoundingClientRect();
            return box.left < edge.left - 1 || box.right > edge.right + 1 || box.bottom > edge.bottom + 1;
        }).map(label => label.textContent);
    })""")
    assert clipped == []
