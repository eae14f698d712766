"""Launching a run from the Runs page."""

import html
import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    return staff


def _form(page: str) -> dict:
    fields = dict(re.findall(r'<input type="(?:text|number)" name="(\w+)" value="([^"]*)"', page))
    fields["recipe"] = html.unescape(re.search(r'<textarea name="recipe"[^>]*>\n?(.*?)</textarea>', page, re.S)[1])
    return fields


def test_it_starts_with_a_recipe_that_launches(client, launcher):
    client.force_login(launcher)
    page = client.get(reverse("run_launch")).content.decode()
    form = _form(page)
    assert form["name"] == "tiny-demo" and "kind: grpo" in form["recipe"]
    response = client.post(reverse("run_launch"), form)
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run_detail", args=[run.pk])
    assert run.state == "pending" and [p.kind for p in run.phases.all()] == ["cpt", "sft", "dpo", "kto", "grpo",
                                                                            "eval"]  # the adapter scored at the end
    assert run.events.get().kind == "launched"
    # Long enough that a box killed a minute in dies mid-phase, with checkpoints before it to resume from.
    cpt = run.phases.get(index=0)
    assert cpt.steps >= 40 and run.recipe["checkpoint"]["every"] < cpt.steps // 4


def test_it_explains_a_broken_recipe_and_launches_nothing(client, launcher):
    client.force_login(launcher)
    form = _form(client.get(reverse("run_launch")).content.decode())
    form["recipe"] = form["recipe"].replace("kind: grpo", "kind: rlhf")
    page = client.post(reverse("run_launch"), form).content.decode()
    assert "The recipe is not usable" in page and "rlhf" in page
    form["bucket"] = "relative/folder"
    assert "absolute path" in client.post(reverse("run_launch"), {**form, "recipe": _form(
        client.get(reverse("run_launch")).content.decode())["recipe"]}).content.decode()
    assert not Run.objects.exists()


def test_it_lets_only_launchers_launch(client, member, staff):
    client.force_login(member)
    assert client.get(reverse("run_launch")).status_code == 403
    client.force_login(staff)  # staff, but without the launch permission
    assert client.post(reverse("run_launch"), {"name": "x"}).status_code == 403
    assert "Launch a run" not in client.get(reverse("runs")).content.decode()
    assert not Run.objects.exists()
