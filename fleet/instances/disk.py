"""The disk a run's box is rented with, worked out from its model (weights, checkpoints, image, headroom), never typed;
a person may rent more, never less. Pure (docs/fleet.md, "fleet/instances/disk.py")."""

import math
from dataclasses import dataclass

from fleet.ranking import Workload

HEADROOM_FRACTION = 0.2
HEADROOM_MIN_GB = 10.0
CHECKPOINTS_BESIDE_KEPT = 2  # the one being written and the one restored from


@dataclass(frozen=True)
class DiskNeed:
    model: str  # what the weights figure is for, in words
    weights_gb: float
    checkpoints: int
    checkpoint_gb: float
    image_gb: float

    @property
    def headroom_gb(self) -> float:
        return max(HEADROOM_MIN_GB, HEADROOM_FRACTION * self._contents_gb)

    @property
    def total_gb(self) -> int:
        return math.ceil(self._contents_gb + self.headroom_gb)

    @property
    def _contents_gb(self) -> float:
        return self.weights_gb + self.checkpoints * self.checkpoint_gb + self.image_gb

    def __str__(self) -> str:
        weights = f"the weights of {self.model} {self.weights_gb:g} GB" if self.weights_gb else \
            f"no weights to download ({self.model})"
        return (f"{self.total_gb} GB: {weights}, {self.checkpoints} checkpoints of {self.checkpoint_gb:g} GB, the "
                f"image {self.image_gb:g} GB and {self.headroom_gb:.0f} GB of headroom")


def needed(figures: Workload, *, keep: int, built_from_config: bool = False,
           listed_weights_gb: float | None = None) -> DiskNeed:
    """What a box needs for a run whose model the ranking knows by `figures` (the recipe it ranks the run with),
    keeping `keep` checkpoints."""
    if built_from_config:
        model, weights = "a model built from its config on the box", 0.0
    else:
        model, weights = figures.model, float(figures.model_download_gb)
        if listed_weights_gb is not None and listed_weights_gb > weights:
            model, weights = f"{figures.model} as listed", round(listed_weights_gb, 1)
    return DiskNeed(model=model, weights_gb=weights, checkpoints=keep + CHECKPOINTS_BESIDE_KEPT,
                    checkpoint_gb=float(figures.checkpoint_gb), image_gb=float(figures.image_gb))


def chosen_disk_gb(need: DiskNeed, asked_gb: int | None) -> int:
    """The disk to rent: what was asked for when it holds the need, the need when nothing was asked; ValueError
    when the ask is below the need."""
    if asked_gb is None:
        return need.total_gb
    if asked_gb < need.total_gb:
        raise ValueError(f"At least {need}.")
    return asked_gb
