"""Every page at a desktop's and a phone's width in Chromium, for an operator and a plain user, over the longest
names, paths and messages (tests/browser/long_words.py): no sideways scrolling, no text out of its cell or cut off, a
one-row header on a phone, no console error, charts with readable axes and whole titles clear of Plotly's toolbar."""

import re

import pytest

from tests.browser import long_words
from tests.browser.conftest import chromium, log_in as sign_in, needs_chromium, wait_until

WIDTHS = (1400, 390)
HEADER_PX = 64  # the most the header may take of a phone's screen

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def seeded(operator, member):
    return long_words.seed(operator, member)


@pytest.fixture
def browser(live_server, seeded):
    with chromium() as browser:  # the rows come first: see tests/browser/conftest.py
        yield browser


def log_in(page, live_server, username="operator"):
    sign_in(page, live_server, username)


def overflow(page) -> dict:
    """How far the page reaches past the window, and the widest elements that make it."""
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const wide = [...document.querySelectorAll('body *')].filter(el => el.getBoundingClientRect().right > width
            || el.scrollWidth > width).slice(0, 5)
            .map(el => el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className);
        return {scroll: document.documentElement.scrollWidth, width, wide};
    }""")


def hidden_text(page, within: str = "body") -> list[str]:
    """The words in `within` a reader cannot see whole: text that runs out of the box it is laid out in (a table cell
    into the next column, a paragraph past its edge), is cut off by a box that clips or scrolls (a wide table in its
    scroller, an ellipsis), or lies outside the window. Plotly's own drawing and text hidden on purpose are left
    out."""
    return page.evaluate("""(within) => {
        const found = [], width = document.documentElement.clientWidth;
        const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
            + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ').join('.') : '');
        const texts = [];
        for (const root of document.querySelectorAll(within)) {
            const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
            while (walker.nextNode()) texts.push(walker.currentNode);
        }
        for (const text of texts) {
            const parent = text.parentElement;  // a closed menu's text is not shown
            if (!text.textContent.trim() || !parent || !parent.checkVisibility({visibilityProperty: true})) continue;
            if (parent.closest('.js-plotly-plot, .visually-hidden, script, style, select, textarea')) continue;
            const range = document.createRange();
            range.selectNodeContents(text);
            const rects = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
            let block = parent;
            while (/^(inline|contents)/.test(getComputedStyle(block).display) && block.parentElement) {
                block = block.parentElement;
            }
            const boxes = [block];
            for (let up = parent; up && up !== document.body; up = up.parentElement) {
                if (getComputedStyle(up).overflowX !== 'visible') boxes.push(up);
            }
            const edges = boxes.map(box => [box, box.getBoundingClientRect()]);
            edges.push([document.documentElement, {left: 0, right: width}]);
            for (const r of rects) {
                const out = edges.find(([, b]) => r.left < b.left - 1 || r.right > b.right + 1);
                if (out) {
                    found.push(`"${text.textContent.trim().slice(0, 40)}" in ${name(parent)} `
                               + `(${Math.round(r.left)}-${Math.round(r.right)} px) outside ${name(out[0])} `
                               + `(${Math.round(out[1].left)}-${Math.round(out[1].right)} px)`);
                    break;
                }
            }
            if (found.length >= 10) break;
        }
        return found;
    }""", within)


def wait_for_charts(page):
    wait_until(page, """() => [...document.querySelectorAll('[data-chart]')].every(
        el => el.dataset.rendered || el.dataset.empty)""", timeout_ms=30_000)


def tick_labels(page, chart: str, axis: str) -> list[str]:
    return page.evaluate(f"""() => [...document.querySelectorAll('[data-chart="{chart}"] .{axis}tick text')]
        .map(t => t.textContent)""")


PAGES = {"operator": long_words.operator_pages, "member": long_words.member_pages}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("user", PAGES)
def test_every_page_fits_the_window_with_every_word_whole_and_no_console_errors(live_server, seeded, browser, user,
                                                                                 width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors, faults = [], {}
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}") if msg.type == "error" else None)
    log_in(page, live_server, user)
    for name, path in PAGES[user](seeded).items():
        errors_before = len(errors)
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == (404 if name == "not found" else 200), name
        if page.locator("[data-chart]").count():
            wait_for_charts(page)
        page.wait_for_load_state("networkidle")
        if name == "not found":  # the browser reports the page's own 404 status; anything else is an error
            errors[errors_before:] = [e for e in errors[errors_before:] if "404" not in e]
            assert page.locator("h1").inner_text() == "Not found"
            assert page.locator("header.top .brand").count() == 1  # the product's own page, styled
        measured = overflow(page)
        if measured["scroll"] > measured["width"]:
            faults[name] = [f"the page is {measured['scroll']} px wide: {measured['wide']}"]
        faults[name] = faults.get(name, []) + hidden_text(page)
    for name, path in (long_words.admin_pages(seeded) if user == "operator" else {}).items():
        # Django's own pages: a wide change list scrolls in its own box there, so the page's width is what counts.
        assert page.goto(f"{live_server.url}{path}").status == 200, name
        measured = overflow(page)
        if measured["scroll"] > measured["width"]:
            faults[name] = [f"the page is {measured['scroll']} px wide: {measured['wide']}"]
    faults = {name: found for name, found in faults.items() if found}
    assert not faults, "\n".join(f"{name}: {found}" for name, found in faults.items())
    assert errors == []


def test_it_draws_readable_axes_and_says_when_there_are_no_steps(live_server, seeded, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    log_in(page, live_server)

    page.goto(f"{live_server.url}/runs/{seeded['fresh'].pk}/")
    wait_for_charts(page)
    empty = page.locator(".chart-empty")
    # every chart, the router's and its per-phase load heatmap among them, says so
    assert empty.count() == page.locator("[data-chart]").count() == 10
    assert "No steps yet" in empty.first.inner_text() and "No cost yet" in page.locator("#chart-cost").inner_text()
    assert "2000" not in page.locator("#run-charts").inner_text()  # no default date axis
    assert page.locator("#run-now").inner_text().startswith("Waiting for a box")

    page.goto(f"{live_server.url}/runs/{seeded['long'].pk}/")
    wait_for_charts(page)
    # its box reported steps but never the router's load: only the router's charts say they have nothing yet
    empty = page.evaluate("() => [...document.querySelectorAll('.chart-empty')].map(e => e.dataset.chart)")
    assert empty and all(chart.startswith("router") for chart in empty), empty
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


def nav_links(page) -> dict[str, bool]:
    """Each main navigation link and whether a reader sees it whole, inside the window."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('header.top nav a')].map(a => {
        const box = a.getBoundingClientRect(), width = document.documentElement.clientWidth;
        const shown = box.width > 0 && box.left >= 0 && box.right <= width && box.top >= 0
            && document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2) === a;
        return [a.textContent.trim(), shown];
    }))""")


@pytest.mark.parametrize("user", ["operator", "member"])
def test_the_header_is_one_short_row_on_a_phone_and_every_link_data_sets_included_is_a_tap_away(
        live_server, seeded, browser, user):
    wanted = ["Offers", "Instances", "Runs", "Data sets", "Inference fleet", "Alerts"] + (
        ["Admin"] if user == "operator" else [])
    desktop = browser.new_page(viewport={"width": 1400, "height": 900})
    log_in(desktop, live_server, user)
    desktop.goto(f"{live_server.url}/runs/")
    assert nav_links(desktop) == dict.fromkeys(wanted, True)
    assert desktop.locator("header.top").bounding_box()["height"] <= HEADER_PX

    phone = browser.new_page(viewport={"width": 390, "height": 800})
    log_in(phone, live_server, user)
    phone.goto(f"{live_server.url}/runs/")
    assert phone.locator("header.top").bounding_box()["height"] <= HEADER_PX
    phone.click("header.top summary")
    assert nav_links(phone) == dict.fromkeys(wanted, True)
    assert phone.locator("header.top .logout button").is_visible()
    phone.click("header.top nav >> text=Data sets")
    phone.wait_for_url(f"{live_server.url}/datasets/")
    assert phone.locator("h1").inner_text() == "Data sets"
    assert phone.locator("header.top").bounding_box()["height"] <= HEADER_PX
    assert phone.locator('header.top nav a[aria-current="page"]').all_text_contents() == ["Data sets"]


def covered_titles(page) -> dict[str, str]:
    """Each chart whose title a reader cannot read whole: cut off by the chart's edge, or under Plotly's toolbar (the
    mode bar a tap or a hover shows over the chart's top right)."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
        const edge = plot.getBoundingClientRect(), title = plot.querySelector('.gtitle');
        const bar = plot.querySelector('.modebar');
        if (!title) return [[plot.dataset.chart, 'no title']];
        const t = title.getBoundingClientRect(), b = bar ? bar.getBoundingClientRect() : null;
        if (t.left < edge.left - 1 || t.right > edge.right + 1) return [[plot.dataset.chart, 'cut off']];
        if (b && b.width && t.left < b.right && b.left < t.right && t.top < b.bottom && b.top < t.bottom) {
            return [[plot.dataset.chart, 'under the toolbar']];
        }
        return [];
    }))""")


@pytest.mark.parametrize("width", WIDTHS)
def test_no_chart_title_is_cut_off_or_under_the_toolbar(live_server, seeded, long_gpu_names, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    log_in(page, live_server)
    for path in (f"/runs/{seeded['long'].pk}/", "/runs/compare/"):
        page.goto(f"{live_server.url}{path}")
        wait_for_charts(page)
        assert page.locator(".js-plotly-plot .modebar").count() >= 3, path
        assert covered_titles(page) == {}, path


@pytest.mark.parametrize("width", WIDTHS)
def test_the_runs_list_shows_every_runs_eta_and_start_whole(live_server, seeded, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    log_in(page, live_server)
    page.goto(f"{live_server.url}/runs/")
    eta, started = "#run-table tbody td:nth-child(11)", "#run-table tbody td:nth-child(12)"
    assert page.locator("#run-table thead th:nth-child(11)").text_content() == "ETA"
    assert page.locator("#run-table thead th:nth-child(12)").text_content() == "Started"
    assert hidden_text(page, f"{eta}, {started}") == []
    shown = page.locator(started).all_inner_texts()
    assert len(shown) == 6 and sum(text.endswith("ago") for text in shown) == 4, shown


@pytest.mark.parametrize("width", WIDTHS)
def test_long_paths_and_messages_wrap_inside_their_own_column(live_server, seeded, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    log_in(page, live_server)
    for path, cells in (("/datasets/", "#datasets td"), ("/alerts/", "#recent-alerts td, #webhook-endpoints td"),
                        (f"/runs/{seeded['long'].pk}/", "#run-events td, #checkpoints td"),
                        (f"/instances/{seeded['live'].pk}/", "#events td"),
                        ("/instances/", "#live-instances td, #ended-instances td")):
        page.goto(f"{live_server.url}{path}")
        assert page.locator(cells).count() > 0, path
        assert hidden_text(page, cells) == [], path
        widest = page.evaluate(f"""() => Math.max(...[...document.querySelectorAll('{cells}')].map(
            cell => cell.closest('table').getBoundingClientRect().right))""")
        assert widest <= width, path
