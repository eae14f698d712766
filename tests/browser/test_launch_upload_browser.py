"""The launch page in a real browser: a launcher chooses a phase's JSONL in the file field, names it in the recipe,
launches, and finds the data set on the run page and the Data sets page with its sha256 and a rendered sample."""

import hashlib
import json

import pytest
from django.contrib.auth.models import Permission

from tests.browser.conftest import chromium, log_in as sign_in, needs_chromium

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
CHAT = {"messages": [{"role": "user", "content": "1 plus 2?"}, {"role": "assistant", "content": None, "tool_calls": [
    {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
    {"role": "tool", "content": "3"}, {"role": "assistant", "content": "It is 3."}]}


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


@pytest.fixture
def page(live_server, launcher):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        sign_in(page, live_server, "staff")
        yield page


def test_a_launcher_uploads_a_phases_data_and_sees_it_stored(live_server, page, tmp_path):
    content = (json.dumps(CHAT) + "\n") * 3
    upload = tmp_path / "tools.jsonl"
    upload.write_text(content)
    digest = hashlib.sha256(content.encode()).hexdigest()

    page.goto(f"{live_server.url}/runs/launch/")
    recipe = page.input_value("textarea[name=recipe]")
    page.fill("textarea[name=recipe]", recipe.replace("data: example:sft.jsonl", "data: tools.jsonl"))
    page.fill("input[name=bucket]", str(tmp_path / "bucket"))
    page.set_input_files("input[name=data_files]", str(upload))
    page.click("form.launch button[type=submit]")
    page.wait_for_url(f"{live_server.url}/runs/*/")
    row = page.locator("#run-datasets tr", has_text="tools.jsonl")
    assert digest[:14] in row.inner_text()

    row.locator("a").click()
    page.wait_for_url(f"{live_server.url}/datasets/*/")
    assert digest in page.inner_text("#dataset-facts")
    assert page.locator("#dataset-sample mark").all_inner_texts()[-1] == "It is 3.\n<eos>"
    assert (tmp_path / "bucket" / "datasets" / digest / "data.jsonl").read_text() == content

    page.goto(f"{live_server.url}/datasets/")
    assert "tools.jsonl" in page.inner_text("#datasets")
