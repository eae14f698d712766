"""Refusals that keep a person's work, in a real browser: the Offers page's profile form says each refused value
beside its field with everything typed kept, a profile is deleted after its confirmation, a profile of the longest
name widens no page at a desktop's or a phone's width, and the launch page stops a 20 MB recipe before sending it."""

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from tests.browser.conftest import chromium, log_in, needs_chromium
from tests.browser.test_offers_browser import overflow

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
LONGEST = "h200" * 15  # a profile's name at its 60 characters, one word: nowhere to break it


@pytest.fixture
def users(operator, staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return operator, staff


@pytest.fixture
def page(live_server, users):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        assert errors == []


def _beside(page, field: str) -> str:
    return page.inner_text(f"#error-{field}")


def test_a_refused_profile_keeps_what_was_typed_and_a_saved_one_is_deleted(live_server, page):
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/offers/")
    page.locator("#ranking").wait_for()
    typed = {"max_usd_per_hour": "abc", "min_reliability": "NaN", "checkpoint_interval_min": "1e308",
             "lora_rank": "32"}
    for field, value in typed.items():
        page.fill(f"#ranking-form [name={field}]", value)
    page.fill("input[name=profile_name]", "p" * 300)
    page.click("form.save-profile button[type=submit]")
    page.locator("#profile-not-saved[role=alert]").wait_for()
    assert "Profile not saved" in page.inner_text("#profile-not-saved")
    assert "Enter a number" in _beside(page, "max_usd_per_hour")
    assert "Enter a number" in _beside(page, "min_reliability")
    assert "At most 10,080." in _beside(page, "checkpoint_interval_min")
    assert "At most 60 characters (this has 300)." in _beside(page, "profile_name")
    for field, value in typed.items():
        assert page.input_value(f"#ranking-form [name={field}]") == value, field
    assert page.input_value("input[name=profile_name]") == "p" * 300
    assert page.url == f"{live_server.url}/offers/" or "/offers/?" in page.url

    for field, value in {"max_usd_per_hour": "4.5", "min_reliability": "0.9", "checkpoint_interval_min": "30"}.items():
        page.fill(f"#ranking-form [name={field}]", value)
    page.fill("input[name=profile_name]", "H200 EU")
    page.click("form.save-profile button[type=submit]")
    page.wait_for_url("**/offers/?profile=h200-eu")
    assert "Profile 'h200-eu' saved." in page.inner_text("main")
    assert page.input_value("#ranking-form [name=max_usd_per_hour]") == "4.5"

    page.click("text=Delete profile")
    page.wait_for_url("**/offers/profiles/*/delete/")
    assert "Nothing ranks offers with it" in page.inner_text("main")
    page.click("button:has-text('Yes, delete the profile')")
    page.wait_for_url(f"{live_server.url}/offers/")
    assert "Profile 'h200-eu' deleted." in page.inner_text("main")
    assert page.locator("#ranking-form select[name=profile]").count() == 0  # no profile is left to choose


@pytest.fixture
def longest_profile(tmp_path):
    """A profile of the longest name, and a finished run whose adapter its serve page offers."""
    from fleet.models import OfferProfile
    from fleet.ranking import OfferFilters, Workload
    from tests.fleet.test_serve_adapter import _finished_run

    OfferProfile.objects.create(name=LONGEST, recipe=Workload().to_dict(), filters=OfferFilters().to_dict(),
                                last_ranking={"ranked": [], "passed": 0}, last_ranked_at=timezone.now())
    return _finished_run(tmp_path)


@pytest.mark.parametrize("width", (1400, 390))
def test_a_profile_of_the_longest_name_widens_no_page(live_server, longest_profile, page, width):
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_server, "operator")
    for path in ("/", f"/offers/?profile={LONGEST}", f"/runs/{longest_profile.pk}/serve/", "/runs/launch/"):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert page.locator(f"option:has-text('{LONGEST}'), a:has-text('{LONGEST}')").count() >= 1, path
        measured = overflow(page)
        assert measured["scroll"] <= measured["width"], f"{path} at {width} px: {measured}"
        for button in page.locator("main form button[type=submit]").all():  # a phone taps each without scrolling
            box = button.bounding_box()
            assert box is None or 0 <= box["x"] and box["x"] + box["width"] <= width, path


def test_a_20_mb_recipe_is_stopped_beside_its_field_with_everything_kept(live_server, page):
    log_in(page, live_server, "staff")
    page.goto(f"{live_server.url}/runs/launch/")
    page.fill("input[name=name]", "my-own-name")
    page.fill("input[name=budget_usd]", "7.25")
    page.evaluate("""() => { const recipe = document.querySelector('textarea[name=recipe]');
                             recipe.value += ('# ' + 'x'.repeat(78) + '\\n').repeat(250 * 1000); }""")  # 20 MB
    page.click("form.launch button[type=submit]", timeout=120_000)  # a browser takes seconds to lay out 20 MB
    note = page.locator("#id_recipe-limit")
    note.wait_for(timeout=60_000)
    assert "at most 262,144 are read" in note.inner_text() and "Nothing was sent" in note.inner_text()
    assert page.url == f"{live_server.url}/runs/launch/"
    assert page.input_value("input[name=name]") == "my-own-name"
    assert page.input_value("input[name=budget_usd]") == "7.25"
    assert page.evaluate("document.querySelector('textarea[name=recipe]').value.length") > 20_000_000
    assert "kind: grpo" in page.input_value("textarea[name=recipe]")


def test_a_save_the_server_fails_says_so_and_keeps_the_fields(live_server, page):
    log_in(page, live_server, "operator")
    page.goto(f"{live_server.url}/offers/")
    page.locator("#ranking").wait_for()
    page.route("**/offers/profiles/", lambda route: route.fulfill(status=500, body="broken"))
    page.fill("#ranking-form [name=lora_rank]", "48")
    page.fill("input[name=profile_name]", "mine")
    page.click("form.save-profile button[type=submit]")
    page.locator("#profile-not-saved[role=alert]").wait_for()
    assert "Profile not saved: the server answered 500" in page.inner_text("#profile-not-saved")
    assert page.input_value("#ranking-form [name=lora_rank]") == "48"
    assert page.input_value("[name=profile_name]") == "mine"
