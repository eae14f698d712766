"""The launch page keeps a launcher's work when it refuses: a data file's problem is said beside the Data files
field, and a request too large to read (from it or any form) gets a page saying the limit and that nothing was
stored."""

import html
import json
import re

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runs.models import DataSet, Run

pytestmark = pytest.mark.django_db
SFT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


@pytest.fixture
def launcher(client, staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    client.force_login(staff)
    return staff


def _form(client, tmp_path) -> dict:
    page = client.get(reverse("run_launch")).content.decode()
    fields = dict(re.findall(r'<input type="(?:text|number)" name="(\w+)" value="([^"]*)"', page))
    fields["recipe"] = html.unescape(re.search(r'<textarea name="recipe"[^>]*>\n?(.*?)</textarea>', page, re.S)[1])
    fields.update(name="my-own-name", budget_usd="7.25", bucket=str(tmp_path / "bucket"))
    fields["recipe"] = fields["recipe"].replace("data: example:sft.jsonl", "data: chat.jsonl")
    return fields


def _beside(page: str, field: str) -> str:
    label = next(m for m in re.findall(r"<label>.*?</label>", page, re.S) if f'name="{field}"' in m)
    return html.unescape(" ".join(re.findall(r'<span class="error">(.*?)</span>', label, re.S)))


@pytest.mark.parametrize("upload, words", [
    (SimpleUploadedFile("chat.jsonl", b'{"messages": []}\n{oops\n'), "chat.jsonl: line 2: not JSON"),
    (SimpleUploadedFile("chats.jsonl", (json.dumps(SFT) + "\n").encode()), "phases[1] (sft).data chat.jsonl: is "
                                                                              "neither a file uploaded"),
])
def test_a_data_files_problem_is_said_beside_the_field_with_the_rest_kept(client, launcher, tmp_path, upload, words):
    form = _form(client, tmp_path)
    page = client.post(reverse("run_launch"), {**form, "data_files": [upload]}).content.decode()
    assert words in _beside(page, "data_files")
    assert "Choose the data files again (" + upload.name + ")" in _beside(page, "data_files")
    assert 'class="error" role="alert"' not in page  # nothing at the top of the form
    assert 'name="name" value="my-own-name"' in page and 'name="budget_usd" value="7.25"' in page
    assert "data: chat.jsonl" in html.unescape(page)
    assert not Run.objects.exists() and not DataSet.objects.exists()


def test_a_request_too_large_to_read_gets_a_page_that_says_the_limit(client, launcher, tmp_path):
    form = _form(client, tmp_path)
    response = client.post(reverse("run_launch"), {**form, "recipe": form["recipe"] + "#" * 20_000_000})
    page = html.unescape(response.content.decode())
    assert response.status_code == 413
    assert "2.5\xa0MB (2,621,440 bytes)" in page and "at most 262,144 characters" in page
    assert "Nothing was launched or stored." in page
    assert not Run.objects.exists()


def test_the_launch_form_tells_the_browser_its_limits(client, launcher):
    page = client.get(reverse("run_launch")).content.decode()
    assert 'data-max-chars="262144"' in page and 'data-max-text-bytes="2621440"' in page
    assert re.search(r'<input type="file" name="data_files"[^>]* data-max-bytes="10737418240"', page)
    assert "js/form-limits.js" in page and "maxlength" not in page.split('name="recipe"', 1)[1].split(">", 1)[0]


def test_another_forms_request_too_large_to_read_gets_the_page_too(client, operator):
    client.force_login(operator)
    response = client.post(reverse("add_webhook_endpoint"), {"name": "x" * 3_000_000},
                           HTTP_REFERER="http://testserver/alerts/")
    page = response.content.decode()
    assert response.status_code == 413 and "Nothing was stored." in page
    assert '<a href="http://testserver/alerts/">The form, anew</a>' in page and "recipe" not in page


def test_a_disk_size_that_is_not_a_number_is_refused_beside_it_not_taken_as_blank(client, launcher, tmp_path):
    page = client.get(reverse("run_launch")).content.decode()
    assert re.search(r'<input type="text" name="disk_gb"[^>]* inputmode="numeric"', page)  # sent as typed
    form = _form(client, tmp_path)
    page = client.post(reverse("run_launch"), {**form, "disk_gb": "abc"}).content.decode()
    assert "Enter a whole number." in _beside(page, "disk_gb") and 'name="disk_gb" value="abc"' in page
    assert not Run.objects.exists()
