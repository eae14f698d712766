from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from runs.launch import launch

EXAMPLES = Path(__file__).resolve().parents[2] / "training" / "examples"


def tiny_recipe(**changes) -> dict:
    """The tiny example recipe with absolute data paths, as a user would paste it."""
    recipe = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    for phase in recipe["phases"]:
        phase["data"] = str(EXAMPLES / phase["data"])
    recipe.pop("checkpoint", None)
    recipe.pop("metrics", None)
    recipe.update(changes)
    return recipe


@pytest.fixture
def launched(tmp_path):
    def make(name="tiny", budget=Decimal("50"), max_restarts=3, **kwargs):
        return launch(name=name, recipe=tiny_recipe(), bucket=str(tmp_path / "bucket"), budget_usd=budget,
                      max_restarts=max_restarts, **kwargs)
    return make
