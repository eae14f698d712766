"""The pages under their Content-Security-Policy in a real browser (Debian's Chromium driven by Playwright): the run
page draws its Plotly charts, the Offers page ranks and loads a profile, the launch page and the admin work, and
none of them makes the browser refuse anything, while a script the policy forbids is refused."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.browser.conftest import chromium, log_in, needs_chromium, wait_until

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
PROFILE = "h200-eu"
# Before any of the page's own scripts run: every violation the browser reports, kept on the window.
LISTEN = """window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(
    `${e.violatedDirective} refused ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));"""
# What an injected inline script would do; the policy must refuse it.
PROBE = """() => { const s = document.createElement("script"); s.textContent = "window.__inlineRan = true;";
    document.head.append(s); return window.__inlineRan === true; }"""


@pytest.fixture
def seeded(operator):
    from fleet.models import Offer, OfferProfile
    from fleet.ranking import OfferFilters, Workload
    from tests.fleet.offer_records import offer_record
    from tests.runs.seeding import seed_run

    now = timezone.now()
    Offer.objects.bulk_create([
        Offer(**Offer.field_values(offer_record(str(20_000 + i), machine_id=str(i), gpu_usd_per_hour=Decimal(2 + i),
                                                total_usd_per_hour=Decimal(2 + i) + Decimal("0.1"))),
              first_seen_at=now - timedelta(hours=1), last_seen_at=now) for i in range(5)])
    OfferProfile.objects.create(name=PROFILE, recipe=Workload().to_dict(),
                                filters=OfferFilters(max_usd_per_hour=Decimal("6")).to_dict())
    return seed_run("healthy")


@pytest.fixture
def page(live_server, seeded):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(LISTEN)
        page.console = []
        page.on("console", lambda message: page.console.append(message.text))
        page.on("pageerror", lambda error: page.console.append(f"page error: {error}"))
        yield page


def assert_nothing_refused(page, where: str) -> None:
    """No violation reported so far on this page; then an injected inline script is refused and reported, which
    shows the policy is in force and that the listener hears it."""
    assert page.evaluate("window.__violations") == [], where
    assert [text for text in page.console if "Content Security Policy" in text or "page error" in text] == [], where
    assert page.evaluate(PROBE) is False, f"{where}: an inline script ran"
    wait_until(page, "window.__violations.length > 0")
    assert all(v.startswith("script-src") for v in page.evaluate("window.__violations")), where
    page.console.clear()


def test_the_run_page_draws_its_plotly_charts_under_the_policy(live_server, seeded, page):
    log_in(page, live_server, "operator")
    assert_nothing_refused(page, "dashboard")
    page.goto(f"{live_server.url}/runs/{seeded.pk}/")
    wait_until(page, "document.querySelectorAll('[data-chart] svg.main-svg').length >= 8", timeout_ms=20_000)
    for chart in ("timeline", "loss", "grad-norms", "cost"):
        assert page.locator(f'[data-chart="{chart}"] svg.main-svg').count() >= 1, chart
        assert page.locator(f'[data-chart="{chart}"] .scatterlayer .trace').count() >= 1, chart
    page.hover('[data-chart="loss"] .nsewdrag')  # the mode bar and hover layer draw more styles
    with page.expect_download() as download:  # through an image of a blob: or data: URL (img-src)
        page.click('[data-chart="loss"] .modebar-btn[data-title="Download plot as a PNG"]')
    assert download.value.suggested_filename.endswith(".png")
    assert_nothing_refused(page, "run page")


def test_the_offers_page_ranks_and_loads_a_profile_under_the_policy(live_server, page):
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/offers/")
    page.locator("#ranking").wait_for()
    with page.expect_response(lambda response: "/offers/?" in response.url):  # htmx asks for a new ranking
        page.locator("#ranking-form input[inputmode]").first.fill("7")
    page.wait_for_timeout(300)
    assert_nothing_refused(page, "offers page, re-ranked")
    page.select_option("#ranking-form select[name=profile]", PROFILE)  # the handler is in static/js/offers.js
    page.wait_for_url(f"**/offers/?profile={PROFILE}")
    page.locator("#ranking").wait_for()
    assert_nothing_refused(page, "offers page with a profile")


def test_the_launch_page_and_the_admin_work_under_the_policy(live_server, seeded, page):
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("input[name=username]", "operator")
    page.fill("input[name=password]", "operator-pass-123")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    assert_nothing_refused(page, "admin index")
    for path in ("/admin/runs/run/", f"/admin/runs/run/{seeded.pk}/change/", "/admin/fleet/offer/",
                 "/admin/axes/accessattempt/", "/runs/launch/"):
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, path
        assert "Content-Security-Policy" in {name.title() for name in response.headers}, path
        assert_nothing_refused(page, path)
    page.locator("#id_recipe").wait_for()
