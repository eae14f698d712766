"""The launch form reads the recipe within bounds: an alias bomb hidden in the model's config is refused with the
reason, and no run (whose stored recipe would be the whole expansion) is written."""

import pytest
import yaml
from django.contrib.auth.models import Permission
from django.urls import reverse

from runs.launch import example_recipe
from runs.models import Run

pytestmark = pytest.mark.django_db


def _bomb(levels: int) -> str:
    """Anchors of nine aliases each, nested: 9**levels strings from a few lines."""
    lines = ['      l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"      l{i}: &l{i} [{', '.join(f'*l{i - 1}' for _ in range(9))}]")
    return "\n".join(lines)


def _post(client, recipe_text: str):
    return client.post(reverse("run_launch"), {"name": "bomb", "recipe": recipe_text, "bucket": "/tmp/fleet-bucket",
                                               "budget_usd": "5.00", "max_restarts": "3"})


def test_it_refuses_an_alias_bomb_and_launches_nothing(client, staff):
    staff.user_permissions.add(Permission.objects.get(codename="launch_run"))
    client.force_login(staff)
    text = yaml.safe_dump(example_recipe(), sort_keys=False, width=110)
    config = "  config:\n    model_type: qwen3_moe\n"
    assert config in text  # model.config takes any transformers field, so the bomb is a valid recipe otherwise
    text = text.replace(config, config + "    rope_scaling:\n" + _bomb(6) + "\n")
    page = _post(client, text).content.decode()
    assert "The recipe cannot be read: the recipe&#x27;s aliases expand to more than 100,000 values." in page
    assert not Run.objects.exists()
