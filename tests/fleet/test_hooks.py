"""fleet's hooks: runs registers its answers when the apps are ready, each once, and fleet calls them."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from fleet import hooks
from runs import serving, supervisor


def test_it_has_the_runs_answers_once_the_apps_are_ready():
    assert hooks._attach == [supervisor.on_box_attached]
    assert hooks._move == [supervisor.on_move]
    assert hooks._read_grant == [serving.adapter_grant]


def test_a_second_registration_of_the_same_function_changes_nothing():
    hooks.on_attach(supervisor.on_box_attached)
    hooks.on_read_grant(serving.adapter_grant)
    assert hooks._attach == [supervisor.on_box_attached] and hooks._read_grant == [serving.adapter_grant]


def test_it_refuses_a_second_read_grant(monkeypatch):
    monkeypatch.setattr(hooks, "_read_grant", [serving.adapter_grant])
    with pytest.raises(ImproperlyConfigured, match="registered already"):
        hooks.on_read_grant(lambda folder_uri, names, expires_s: {})


def test_a_move_is_the_first_handler_that_takes_it(monkeypatch):
    asked = []
    monkeypatch.setattr(hooks, "_move", [lambda *a: asked.append("first") or False,
                                         lambda *a: asked.append("second") or True,
                                         lambda *a: asked.append("third") or True])
    assert hooks.moved(None, "hung", None) is True
    assert asked == ["first", "second"]


def test_it_says_when_no_app_grants_reads(monkeypatch):
    monkeypatch.setattr(hooks, "_read_grant", [])
    with pytest.raises(ImproperlyConfigured, match="No app registered"):
        hooks.read_grant("s3://bucket/adapter/", ["adapter_model.safetensors"], 60)
