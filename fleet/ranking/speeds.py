"""How fast the recipe runs on each offer that passed the filters, as one numpy column for the whole catalogue
(docs/fleet.md, "fleet/ranking/speeds.py")."""

import math
from itertools import compress
from operator import attrgetter, truth

import numpy as np

from fleet.providers.records import OfferRecord

from .workload import Workload
from .throughput import DEFAULT_LISTED_TO_MODEL_TFLOPS, Throughput, ThroughputModel, anchor_ratio, model_tflops_of


class OfferSpeeds:
    """Per-offer tokens/s (NaN without an estimate), each offer's GPU model by number, each model's calibrated
    Throughput (None if estimated), and the anchors the estimates took."""

    def __init__(self, offers: list[OfferRecord], speeds: ThroughputModel, recipe: Workload):
        first_at: dict[tuple, int] = {}  # each model's first offer's place
        first = np.fromiter([first_at.setdefault(key, i) for i, key in enumerate(map(speeds.key, offers))], np.intp,
                            len(offers))  # each offer's model's
        model_at = np.fromiter(first_at.values(), np.intp, len(first_at))  # rising: the models in the order they come
        self.models = np.searchsorted(model_at, first)
        model_offers = list(map(offers.__getitem__, model_at.tolist()))  # each model as its first offer lists it
        self.throughputs: list[Throughput | None] = list(map(speeds.calibrated, model_offers))
        known = np.array([t is not None for t in self.throughputs], bool)
        self.calibrated = known[self.models]
        self.tokens_per_s = np.array([math.nan if t is None else t.tokens_per_s for t in self.throughputs],
                                     float)[self.models]
        self.listed_ratio: dict[int, float | None] = {}
        self.dlperf_ratio: dict[int, float | None] = {}
        self.any_listed: float | None = None
        self.any_dlperf: float | None = None
        if not known.all():
            self._estimate(offers, model_offers, speeds, recipe)

    def _estimate(self, offers: list[OfferRecord], model_offers: list[OfferRecord], speeds: ThroughputModel,
                  recipe: Workload):
        calibrated = self.calibrated
        archs = [o.compute_capability for o in model_offers]
        per_gpu = [math.nan if t is None else model_tflops_of(speeds.one_gpu_share(o, t.tokens_per_s), recipe)
                   for o, t in zip(model_offers, self.throughputs, strict=True)]
        anchors = _Anchors(calibrated, self.models, archs, per_gpu, [o.num_gpus for o in model_offers])
        flops, dlperf = (list(map(attrgetter(field), offers)) for field in ("total_flops", "dlperf"))
        flops_column, dlperf_column = np.array(flops, float), np.array(dlperf, float)  # None as NaN
        self.listed_ratio, self.any_listed = anchors.ratios(flops, flops_column)
        self.dlperf_ratio, self.any_dlperf = anchors.ratios(dlperf, dlperf_column)

        estimated = ~calibrated
        listed_to_model = [self.listed_ratio.get(cc, self.any_listed) or DEFAULT_LISTED_TO_MODEL_TFLOPS
                           for cc in archs]
        dlperf_to_model = [self.dlperf_ratio.get(cc, self.any_dlperf) or 0.0 for cc in archs]
        per_model = np.array([[o.num_gpus or 1 for o in model_offers], listed_to_model, dlperf_to_model,
                              list(map(speeds.estimate_scale, model_offers))], float)[:, self.models[estimated]]
        self.tokens_per_s[estimated] = speeds.estimate_columns(
            flops_column[estimated], dlperf_column[estimated], *per_model)


class _Anchors:
    """The calibrated offers' achieved model TFLOP/s per GPU and compute capability, to anchor a listed figure on."""

    def __init__(self, calibrated: np.ndarray, models: np.ndarray, archs: list, per_gpu: list, num_gpus: list):
        self.calibrated = calibrated
        models = models[calibrated]
        self.archs = {cc: number for number, cc in enumerate(dict.fromkeys(archs))}
        self.arch = np.array([self.archs[cc] for cc in archs])[models]
        self.per_gpu = np.array(per_gpu)[models]
        self.num_gpus = np.array(num_gpus, float)[models]

    def ratios(self, figures: list, column: np.ndarray) -> tuple[dict, float | None]:
        """anchor_ratio per compute capability and across all, for one listed figure; a capability whose calibrated
        offers list the figure only as 0 or less, or NaN, gets None (the default)."""
        with np.errstate(invalid="ignore"):
            listed = column[self.calibrated] / self.num_gpus
            usable = listed > 0
        ratios = {}
        for cc, number in self.archs.items():
            mine = self.arch == number
            if (usable & mine).any():
                ratios[cc] = anchor_ratio(self.per_gpu[mine], listed[mine])
            elif mine.any() and any(map(truth, compress(compress(figures, self.calibrated.tolist()), mine.tolist()))):
                ratios[cc] = None
        return ratios, anchor_ratio(self.per_gpu, listed)


def column(offers: list[OfferRecord], field: str) -> np.ndarray:
    """One number field of the offers as floats (None as NaN)."""
    return np.array(list(map(attrgetter(field), offers)), float)
