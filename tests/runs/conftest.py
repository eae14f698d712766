from decimal import Decimal

import pytest

from runs.launch import example_recipe, launch


def tiny_recipe(**changes) -> dict:
    """The tiny example recipe the launch form starts with, with changes."""
    return {**example_recipe(), **changes}


@pytest.fixture
def launched(tmp_path):
    def make(name="tiny", budget=Decimal("50"), max_restarts=3, **kwargs):
        return launch(name=name, recipe=tiny_recipe(), bucket=str(tmp_path / "bucket"), budget_usd=budget,
                      max_restarts=max_restarts, **kwargs)
    return make
