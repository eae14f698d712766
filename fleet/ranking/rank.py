"""rank_offers: which offer runs this recipe for the fewest dollars, and why every other offer does not.

Score is steps per dollar of the whole run: the recipe's steps over its expected total cost on the offer (cost.py),
which is throughput (throughput.py) over the full hourly cost with start-up, traffic and expected restarts spread
over the run. Ranking on the listed $/h alone is what put runs on hosts that were cheap and then failed; here the
filters drop what cannot work at all, and the cost model prices what works badly.

Pure and fast: plain records in, plain records out, no database or network, so the Offers page, a Celery task and
the rank_offers command share it. The scoring pass is floats, worked out once per GPU model where it can be; a ranked
offer's projection, throughput words and Decimal money, the words of an exclusion and the "why" lines are worked out
when something reads them, so 10,000 offers that all pass rank in about 30 ms (bench/ranking.py).
"""

import gc
import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from itertools import compress, islice, repeat
from operator import attrgetter, eq, itemgetter, not_

from fleet.providers.records import OfferRecord

from .cost import CostBreakdown, CostModel, Projection
from .filters import NO_THROUGHPUT, RANKING_BITS, UNBOUNDED_COST, CompiledFilters, OfferFilters, compile_filters, usd
from .recipe import Recipe
from .throughput import SEED_CALIBRATION, Calibration, Throughput, ThroughputModel, model_tflops_of


class RankedOffer:
    """One offer that passed, with its score. Immutable by convention. Only the score is worked out while ranking;
    the throughput's words, the float projection and the Decimal money (`cost`) are worked out on first read, so
    ranking 10,000 offers pays for them only on the ones a page shows."""

    __slots__ = ("offer", "rank", "steps_per_usd", "_total", "_throughput", "_pricing", "_projection", "_cost")

    def __init__(self, offer, rank, steps_per_usd, total, throughput, pricing):
        self.offer: OfferRecord = offer
        self.rank: int = rank  # 1 = best
        self.steps_per_usd: float = steps_per_usd
        self._total = total  # the float total the score came from
        self._throughput = throughput  # None for an estimate until read: its words cost more than its number
        self._pricing: _Pricing = pricing
        self._projection = None
        self._cost = None

    def __repr__(self):
        o = self.offer
        return (f"<RankedOffer #{self.rank} {o.provider}:{o.offer_id} {o.gpu_name} "
                f"{self.steps_per_usd:.1f} steps/$>")

    @property
    def tokens_per_usd(self) -> float:
        total = self._total
        return self._pricing.tokens_per_run / total if total > 0 else 0.0

    @property
    def throughput(self) -> Throughput:
        if self._throughput is None:
            self._throughput = self._pricing.estimate(self.offer)
        return self._throughput

    @property
    def projection(self) -> Projection:
        if self._projection is None:
            o = self.offer
            pricing = self._pricing
            self._projection = pricing.costs.estimate(o, pricing.tokens_per_step / self.throughput.tokens_per_s, o.is_bid)
        return self._projection

    @property
    def cost(self) -> CostBreakdown:
        if self._cost is None:
            self._cost = self._pricing.costs.breakdown(self.offer, self.projection)
        return self._cost

    @property
    def total_usd(self) -> Decimal:
        return self.cost.total_usd

    @property
    def usd_per_hour(self) -> Decimal:
        return self.cost.usd_per_hour

    @property
    def wall_hours(self) -> float:
        return self.projection.wall_hours

    @property
    def tokens_per_s(self) -> float:
        return self.throughput.tokens_per_s

    @property
    def kernel_path(self) -> str:
        return self.throughput.kernel_path

    @property
    def estimated(self) -> bool:
        """The throughput is a spec-sheet estimate, not a measurement."""
        return self.throughput.estimated

    @property
    def interruptible(self) -> bool:
        """A bid rental: the marketplace may reclaim it."""
        return self.offer.is_bid

    @property
    def why(self) -> tuple[str, ...]:
        o, p, c, t = self.offer, self.projection, self.cost, self.throughput
        lines = [
            f"{t.tokens_per_s:,.0f} tok/s, {p.step_s:.0f} s/step ({t.source})",
            f"{usd(o.gpu_usd_per_hour or o.total_usd_per_hour)}/h listed GPU; {usd(c.usd_per_hour)}/h all-in "
            f"over {p.wall_hours:.1f} h",
            f"start-up {p.startup_s / 60:.0f} min billed ({usd(c.startup_usd)}); traffic {usd(c.download_usd)} model "
            f"download + {usd(c.upload_usd)} for {p.checkpoints} checkpoints",
        ]
        if p.expected_restarts:
            lines.append(
                f"reliability {o.reliability:.3f}: {p.expected_restarts:.2f} expected restarts ({usd(c.restart_usd)})")
        if o.is_bid:
            lines.append("interruptible (bid): may be reclaimed mid-phase; fine for smoke tests")
        if t.estimated:
            lines.append("throughput is an estimate: no run has measured this GPU")
        return tuple(lines)


class Exclusion:
    """One offer that did not pass; `reasons` holds every filter that excludes it, in filter order."""

    __slots__ = ("offer", "mask", "_filters")

    def __init__(self, offer: OfferRecord, mask: int, filters: CompiledFilters):
        self.offer = offer
        self.mask = mask  # the first failed filter's bit, or a ranking bit (see filters.py)
        self._filters = filters

    @property
    def reasons(self) -> tuple[str, ...]:
        # The ranking stops at an offer's first failed filter; every reason is worked out when someone reads them.
        full = self._filters.mask(self.offer) | (self.mask & RANKING_BITS)
        return self._filters.reasons(self.offer, full)

    def __repr__(self):
        return f"<Exclusion {self.offer.provider}:{self.offer.offer_id} {'; '.join(self.reasons)}>"


@dataclass(frozen=True)
class Ranking:
    entries: tuple[RankedOffer, ...]  # best first
    excluded: tuple[Exclusion, ...]  # in the order the offers came
    recipe: Recipe
    filters: OfferFilters

    def find(self, offer_id: str, *, provider: str | None = None, is_bid: bool | None = None):
        """The RankedOffer or Exclusion for one offer, or None if it was not in the catalogue."""
        for item in (*self.entries, *self.excluded):
            o = item.offer
            if o.offer_id == offer_id and (provider is None or o.provider == provider) \
                    and (is_bid is None or o.is_bid == is_bid):
                return item
        return None

    def to_dict(self, limit: int | None = None) -> dict:
        """JSON-ready summary for the command line and the API; money as strings."""
        entries = self.entries if limit is None else self.entries[:limit]
        return {
            "recipe": self.recipe.to_dict(),
            "filters": self.filters.to_dict(),
            "ranked": [
                {
                    "rank": e.rank,
                    "provider": e.offer.provider,
                    "offer_id": e.offer.offer_id,
                    "gpu_name": e.offer.gpu_name,
                    "num_gpus": e.offer.num_gpus,
                    "steps_per_usd": round(e.steps_per_usd, 3),
                    "tokens_per_usd": round(e.tokens_per_usd),
                    "wall_hours": round(e.wall_hours, 2),
                    "total_usd": str(e.total_usd),
                    "usd_per_hour": str(e.usd_per_hour),
                    "estimated": e.estimated,
                    "interruptible": e.interruptible,
                    "why": list(e.why),
                }
                for e in entries
            ],
            "excluded": [
                {"provider": x.offer.provider, "offer_id": x.offer.offer_id, "is_bid": x.offer.is_bid,
                 "reasons": list(x.reasons)}
                for x in self.excluded
            ],
        }


class _Pricing:
    """What a RankedOffer needs to work out its deferred fields, shared by every entry of one ranking."""

    __slots__ = ("speeds", "costs", "tokens_per_step", "tokens_per_run", "listed_ratio", "dlperf_ratio",
                 "any_listed", "any_dlperf")

    def __init__(self, speeds: ThroughputModel, costs: CostModel, recipe: Recipe):
        self.speeds = speeds
        self.costs = costs
        self.tokens_per_step = recipe.tokens_per_step
        self.tokens_per_run = recipe.total_steps * recipe.tokens_per_step
        # spec-sheet anchors per compute capability, and across all of them (see rank_offers)
        self.listed_ratio: dict[int, float | None] = {}
        self.dlperf_ratio: dict[int, float | None] = {}
        self.any_listed: float | None = None
        self.any_dlperf: float | None = None

    def estimate(self, o: OfferRecord) -> Throughput | None:
        cc = o.compute_capability
        return self.speeds.estimate(
            o, self.listed_ratio.get(cc, self.any_listed), self.dlperf_ratio.get(cc, self.any_dlperf))

    def estimate_speeds(self, offers: list[OfferRecord]) -> list[float | None]:
        return self.speeds.estimate_speeds(offers, self.listed_ratio, self.dlperf_ratio, self.any_listed,
                                           self.any_dlperf)


def best_offer(ranked: list[OfferRecord], avoid_machines=frozenset(), avoid_offers=frozenset()
               ) -> OfferRecord | None:
    """The best-ranked offer (records, best first) not on a machine to avoid and not already taken (provider,
    offer_id), or None."""
    return next((o for o in ranked if not (o.machine_id and o.machine_id in avoid_machines)
                 and (o.provider, o.offer_id) not in avoid_offers), None)


def rank_offers(
    offers,
    recipe: Recipe | None = None,
    filters: OfferFilters | None = None,
    *,
    calibration: Calibration | None = None,
) -> Ranking:
    """Every offer either ranked (best steps per dollar first) or excluded with all of its reasons.

    recipe and filters default to the product's defaults; calibration to the seeded throughput table.

    Past the filters the work goes a column at a time (offers, their catalogue positions, step times, totals),
    through map, compress and sorted where it can, so that the per-offer Python is the cost arithmetic alone.
    """
    with _no_cycle_collection():
        return _rank(offers if isinstance(offers, list) else list(offers), recipe or Recipe(), filters or OfferFilters(),
                     calibration)


@contextmanager
def _no_cycle_collection():
    """Ranking 10,000 offers allocates tens of thousands of objects that outlive the call (the RankedOffers) or die
    young without a cycle among them; a cyclic collection started by those allocations walks every object of the
    process and frees nothing, and took about a fifth of the ranking's time. It runs after the ranking instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rank(offers: list[OfferRecord], recipe: Recipe, filters: OfferFilters, calibration: Calibration | None
          ) -> Ranking:
    compiled = compile_filters(filters, recipe)
    speeds = ThroughputModel(calibration or SEED_CALIBRATION, recipe)
    costs = CostModel(recipe)
    pricing = _Pricing(speeds, costs, recipe)
    tokens_per_step = recipe.tokens_per_step

    first_failed = compiled.first_failed_in(offers)
    if any(first_failed):
        excluded = [Exclusion(o, bit, compiled) for o, bit in zip(offers, first_failed) if bit]
        passing = list(map(not_, first_failed))
        passed, passed_at = list(compress(offers, passing)), list(compress(range(len(offers)), passing))
    else:
        excluded, passed, passed_at = [], offers, range(len(offers))

    # Many offers share a GPU model and count, so a throughput and its step time are looked up once per
    # (gpu_name, compute_capability, num_gpus): (throughput, step time, achieved model TFLOP/s per GPU), or None
    # when no calibration covers it.
    keys = list(map(_model_key, passed))
    per_model = {}
    for key, o in dict(zip(keys, passed)).items():
        t = speeds.calibrated(o)
        per_model[key] = None if t is None else (
            t, tokens_per_step / t.tokens_per_s, model_tflops_of(t.tokens_per_s / o.num_gpus, recipe))
    known = list(map(per_model.__getitem__, keys))
    is_calibrated = list(map(bool, known))
    scored = list(compress(passed, is_calibrated))
    scored_at = list(compress(passed_at, is_calibrated))
    known = list(compress(known, is_calibrated))
    throughputs = list(map(_first, known))
    step_seconds = list(map(_second, known))

    if len(scored) < len(passed):
        is_uncalibrated = list(map(not_, is_calibrated))
        uncalibrated = list(compress(passed, is_uncalibrated))
        uncalibrated_at = list(compress(passed_at, is_uncalibrated))
        _anchor(pricing, zip(scored, map(_third, known)))
        estimated = pricing.estimate_speeds(uncalibrated)
        usable = [speed is not None and speed > 0 for speed in estimated]
        if not all(usable):
            excluded.extend([Exclusion(o, NO_THROUGHPUT, compiled)
                             for o in compress(uncalibrated, map(not_, usable))])
            uncalibrated, uncalibrated_at, estimated = (list(compress(column, usable))
                                                        for column in (uncalibrated, uncalibrated_at, estimated))
        scored += uncalibrated
        scored_at += uncalibrated_at
        step_seconds += map(float(tokens_per_step).__truediv__, estimated)  # as int / float does
        throughputs += repeat(None, len(estimated))  # worked out when read, from the same anchors (RankedOffer)

    totals = costs.totals(scored, step_seconds)
    bounded = list(map(math.inf.__gt__, totals))  # NaN is not below infinity either
    if not all(bounded):
        excluded.extend([Exclusion(o, UNBOUNDED_COST, compiled) for o in compress(scored, map(not_, bounded))])
        scored, scored_at, totals, throughputs = (list(compress(column, bounded))
                                                  for column in (scored, scored_at, totals, throughputs))
    steps = float(recipe.total_steps)  # int / float divides the int's exact float, so the scores come out the same
    scores = list(map(steps.__truediv__, totals)) if all(map(_POSITIVE, totals)) else \
        [steps / total if total > 0 else 0.0 for total in totals]
    order = _order(scores, totals, scored, scored_at)
    ranked = tuple(map(RankedOffer, map(scored.__getitem__, order), range(1, len(order) + 1),
                       map(scores.__getitem__, order), map(totals.__getitem__, order),
                       map(throughputs.__getitem__, order), repeat(pricing)))
    return Ranking(ranked, tuple(excluded), recipe, filters)


_model_key = attrgetter("gpu_name", "compute_capability", "num_gpus")
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
_POSITIVE = (0.0).__lt__


def _anchor(pricing: "_Pricing", anchors) -> None:
    """Anchor spec-sheet figures on what calibrated offers in this same catalogue list, whatever unit the marketplace
    uses for total_flops and dlperf; per architecture where one is calibrated, because the kernel path (and so the
    achieved share of the listed figure) follows the architecture. anchor_ratio's medians, of ratios gathered
    straight away rather than of pairs."""
    listed_ratios, dlperf_ratios = {}, {}
    for o, per_gpu in anchors:
        if o.total_flops:
            listed = o.total_flops / o.num_gpus
            if listed > 0:
                listed_ratios.setdefault(o.compute_capability, []).append(per_gpu / listed)
        if o.dlperf:
            listed = o.dlperf / o.num_gpus
            if listed > 0:
                dlperf_ratios.setdefault(o.compute_capability, []).append(per_gpu / listed)
    pricing.listed_ratio = {cc: statistics.median(ratios) for cc, ratios in listed_ratios.items()}
    pricing.dlperf_ratio = {cc: statistics.median(ratios) for cc, ratios in dlperf_ratios.items()}
    pricing.any_listed = _median_of_all(listed_ratios)
    pricing.any_dlperf = _median_of_all(dlperf_ratios)


def _median_of_all(ratios: dict[int, list[float]]) -> float | None:
    every = [ratio for per_cc in ratios.values() for ratio in per_cc]
    return statistics.median(every) if every else None


def _order(scores: list[float], totals: list[float], offers: list[OfferRecord], arrivals: list[int]) -> list[int]:
    """Positions into the columns, best score first, then the cheaper run, then a stable id, then catalogue order.

    Sorting positions on the float score alone is several times faster than sorting tuples and allocates nothing
    per offer; equal scores are rare, so only runs of them are put in tie order afterwards.
    """
    order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
    ordered = list(map(scores.__getitem__, order))
    ties = list(map(eq, ordered, islice(ordered, 1, None)))  # ties[k]: the k-th and the next score are equal
    if not any(ties):
        return order

    def tie_order(k):
        o = offers[k]
        return totals[k], o.provider, o.offer_id, o.is_bid, arrivals[k]

    start = end = None
    for k in compress(range(len(ties)), ties):
        if k != end:  # a new run of equal scores begins at k
            if start is not None:
                order[start:end + 1] = sorted(order[start:end + 1], key=tie_order)
            start = k
        end = k + 1
    order[start:end + 1] = sorted(order[start:end + 1], key=tie_order)
    return order
