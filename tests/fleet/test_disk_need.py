"""The disk a run's box is rented with comes from its model's size figures, the ranking's own, never typed."""

import pytest

from fleet.instances.disk import chosen_disk_gb, needed
from fleet.ranking import Workload
from fleet.ranking.workload import PRESETS


def test_it_adds_the_weights_the_checkpoints_the_image_and_headroom():
    need = needed(PRESETS["qwen3-30b-a3b"], keep=3)
    contents = 61.0 + 5 * 7.4 + 12.0  # weights, 3 kept + the one being written + the one restored, the image
    assert need.weights_gb == 61.0 and need.checkpoints == 5 and need.total_gb == 132  # ceil(contents * 1.2)
    assert need.total_gb == -(-contents * 1.2 // 1)
    assert str(need).startswith("132 GB: the weights of Qwen3-30B-A3B 61 GB, 5 checkpoints of 7.4 GB, the image 12 GB")


def test_it_follows_the_figures_the_ranking_prices_the_model_with():
    small, large = Workload(model_download_gb=10.0, checkpoint_gb=1.0), Workload(model_download_gb=470.0)
    assert needed(large, keep=3).total_gb > needed(small, keep=3).total_gb
    assert needed(small, keep=1).total_gb < needed(small, keep=10).total_gb


def test_it_takes_the_listed_files_when_they_are_larger_than_the_figure():
    assert needed(Workload(), keep=3, listed_weights_gb=120.0).weights_gb == 120.0
    assert needed(Workload(), keep=3, listed_weights_gb=1.0).weights_gb == Workload().model_download_gb


def test_a_model_built_from_its_config_downloads_no_weights_and_keeps_the_minimum_headroom():
    need = needed(Workload(checkpoint_gb=0.001, image_gb=12.0), keep=3, built_from_config=True)
    assert need.weights_gb == 0 and need.headroom_gb == 10.0 and need.total_gb == 23
    assert "no weights to download (a model built from its config on the box)" in str(need)


def test_a_person_may_rent_more_disk_never_less():
    need = needed(Workload(), keep=3)
    assert chosen_disk_gb(need, None) == need.total_gb
    assert chosen_disk_gb(need, need.total_gb + 100) == need.total_gb + 100
    with pytest.raises(ValueError, match=f"At least {need.total_gb} GB: the weights of Qwen3.6-35B-A3B 67 GB"):
        chosen_disk_gb(need, need.total_gb - 1)
