"""The Offers page and the rent confirmation in a real browser (Debian's Chromium driven by Playwright) at a
desktop's and a phone's width, over 10,000 stored offers and with a saved profile selected: nothing scrolls sideways,
nothing is cut off (the reasons, the Preset select, the Phases input, the Rent column), nothing logs a console error,
and the excluded offers come grouped by reason."""

import os
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.browser.conftest import chromium, log_in as sign_in, needs_chromium

WIDTHS = (1400, 390)
OFFERS = 10_000
SHOTS = os.environ.get("OFFERS_BROWSER_SHOTS")  # a folder to keep a screenshot of each page in, when set

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def seeded(operator):
    from fleet.models import Offer, OfferProfile
    from fleet.ranking import OfferFilters, Workload
    from tests.fleet.offer_records import offer_record

    now = timezone.now()
    gpus = (("H200", 140.4, 90), ("RTX PRO 6000 S", 95.6, 120), ("B200", 179.0, 100), ("A100 PCIE", 40.0, 80))
    rows = []
    for i in range(OFFERS):
        gpu, ram, cc = gpus[i % len(gpus)]
        record = offer_record(
            str(10_000_000 + i), gpu_name=gpu, gpu_ram_gb=ram, compute_capability=cc, machine_id=str(i),
            gpu_usd_per_hour=Decimal("0.90") + Decimal(i % 300) / 100, total_usd_per_hour=Decimal("0.95")
            + Decimal(i % 300) / 100, reliability=0.90 + (i % 10) / 100, is_bid=i % 7 == 0,
            driver_version="535.129.03" if i % 11 == 0 else "570.124.06", inet_up_mbps=100.0 + i % 900,
            geolocation="Sweden, SE" if i % 2 else "US-CA, US", num_gpus=1 if i % 13 else 8)
        rows.append(Offer(**Offer.field_values(record), first_seen_at=now - timedelta(hours=1), last_seen_at=now))
    Offer.objects.bulk_create(rows, batch_size=1000)
    OfferProfile.objects.create(name="h200-eu-reliable-long-profile-name", recipe=Workload().to_dict(),
                                filters=OfferFilters(max_usd_per_hour=Decimal("6"), min_reliability=0.9,
                                                     gpu_tiers=()).to_dict())
    return Offer.objects.filter(is_bid=False, gpu_name="H200").order_by("offer_id").first()


@pytest.fixture
def browser(live_server, seeded):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        yield browser


def log_in(page, live_server):
    sign_in(page, live_server, "operator")


def overflow(page) -> dict:
    """How far the page reaches past the window, and the elements that reach past it."""
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const wide = [...document.querySelectorAll('body *')].filter(el => el.getBoundingClientRect().right > width + 1)
            .slice(0, 5).map(el => el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className);
        return {scroll: document.documentElement.scrollWidth, width, wide};
    }""")


def cut_off(page, selectors) -> list[str]:
    """The elements drawn narrower than what they hold, or past the right edge of a box that clips them: what a
    person would see cut off (a select showing half its choice, an input showing half its text, a hidden column)."""
    return page.evaluate("""(selectors) => {
        const clipped = (el) => {
            const box = el.getBoundingClientRect();
            for (let up = el.parentElement; up; up = up.parentElement) {
                const style = getComputedStyle(up);
                if (style.overflowX === 'visible') continue;
                const edge = up.getBoundingClientRect();
                if (box.right > edge.right + 1 && up.scrollWidth <= up.clientWidth + 1) return true;
                if (style.overflowX !== 'visible') break;
            }
            return false;
        };
        const found = [];
        for (const selector of selectors) {
            for (const el of document.querySelectorAll(selector)) {
                const narrow = el.tagName === 'SELECT' ? el.scrollWidth > el.clientWidth + 1
                    : el.tagName === 'INPUT' ? el.scrollWidth > el.clientWidth + 1 : false;
                if (narrow || clipped(el)) { found.push(selector); break; }
            }
        }
        return found;
    }""", selectors)


def watch(page) -> list[str]:
    errors = []
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}") if msg.type == "error" else None)
    return errors


def shot(page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))


@pytest.mark.parametrize("width", WIDTHS)
def test_it_lays_out_the_offers_page_with_a_profile_without_cutting_anything_off(live_server, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = watch(page)
    log_in(page, live_server)
    for name, query in (("default", ""), ("profile", "?profile=h200-eu-reliable-long-profile-name")):
        page.goto(f"{live_server.url}/offers/{query}")
        page.wait_for_load_state("networkidle")
        assert page.locator("#ranked tbody tr[data-offer]").count() == 100, name
        page.locator("#ranked tbody tr").first.locator("details summary").click()  # the reasons of the best one
        groups = page.locator("#excluded details.excluded-group")
        assert 1 < groups.count() < 30  # grouped by reason, not a row per offer
        groups.first.locator("summary").click()
        assert groups.first.locator("tbody tr").count() >= 1
        shot(page, f"offers-{name}-{width}")
        measured = overflow(page)
        assert measured["scroll"] <= measured["width"], f"{name} at {width} px: {measured}"
        assert cut_off(page, ["select[name=preset]", "input[name=phases]", "select[name=profile]",
                              "#ranked td.why details[open] li", "#excluded details[open] td.reasons"]) == [], name
        rent = page.locator("#ranked tbody tr").first.locator("a.button")
        assert rent.is_visible() and rent.bounding_box()["x"] + rent.bounding_box()["width"] <= width
        if width == 1400:  # the whole row, Rent column included, shows without scrolling the table
            box = page.locator("#ranked").bounding_box()
            assert box["x"] + box["width"] <= page.locator("#ranking").bounding_box()["x"] + \
                page.locator("#ranking").bounding_box()["width"] + 1
    assert errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_it_shows_an_error_by_its_field_and_says_the_table_is_not_updated(live_server, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = watch(page)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/offers/")
    page.wait_for_load_state("networkidle")
    page.fill("input[name=seq_len]", "100000000000")
    page.locator("#ranking-not-updated").wait_for(timeout=15_000)
    assert page.locator("#error-seq_len").inner_text() == "At most 1,048,576."
    assert page.locator("#ranked").count() == 0
    shot(page, f"offers-error-{width}")
    measured = overflow(page)
    assert measured["scroll"] <= measured["width"], measured
    assert errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_it_lays_out_the_rent_confirmation(live_server, browser, seeded, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = watch(page)
    log_in(page, live_server)
    page.goto(f"{live_server.url}/instances/rent/?provider=vast&offer={seeded.offer_id}&bid=0")
    page.wait_for_load_state("networkidle")
    assert page.locator("button[type=submit]", has_text="Rent for $").is_visible()
    shot(page, f"rent-{width}")
    measured = overflow(page)
    assert measured["scroll"] <= measured["width"], measured
    assert cut_off(page, ["input[name=image]", "input[name=disk_gb]"]) == []
    assert errors == []
