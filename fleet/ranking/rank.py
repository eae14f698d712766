"""rank_offers: which offer runs this recipe for the fewest dollars, and why every other offer does not.

Score is steps per dollar of the whole run: the recipe's steps over its expected total cost on the offer (cost.py),
which is throughput (throughput.py) over the full hourly cost with start-up, traffic and expected restarts spread
over the run. Ranking on the listed $/h alone is what put runs on hosts that were cheap and then failed; here the
filters drop what cannot work at all, and the cost model prices what works badly.

Pure and fast: plain records in, plain records out, no database or network, so the Offers page, a Celery task and
the rank_offers command share it. The scoring pass is floats, worked out once per GPU model where it can be; a ranked
offer's projection, throughput words and Decimal money, the words of an exclusion and the "why" lines are worked out
when something reads them. 10,000 offers rank in about 8 ms with the default filters and 36-41 ms with every filter
off (with the prices the refresh stores as floats) on the 2-core control-plane machine (bench/ranking.py,
bench/NOTES_control_plane.md).
"""

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Sequence
from decimal import Decimal
from operator import attrgetter

from fleet.providers.records import OfferRecord

from .cost import CostBreakdown, CostModel, OfferPrices, Projection, offer_prices
from .filters import NO_THROUGHPUT, RANKING_BITS, UNBOUNDED_COST, CompiledFilters, OfferFilters, compile_filters, usd
from .recipe import Recipe
from .throughput import (
    SEED_CALIBRATION,
    Calibration,
    Throughput,
    ThroughputModel,
    anchor_ratio,
    interconnect,
    model_tflops_of,
)


class RankedOffer:
    """One offer that passed, with its score. Immutable by convention. Only the score is worked out while ranking;
    the throughput's words, the float projection and the Decimal money (`cost`) are worked out on first read, so
    ranking 10,000 offers pays for them only on the ones a page shows."""

    __slots__ = ("offer", "rank", "steps_per_usd", "_total", "_arrival", "_throughput", "_pricing", "_projection",
                 "_cost")

    def __init__(self, offer, steps_per_usd, total, arrival, throughput, pricing):
        self.offer: OfferRecord = offer
        self.rank: int = 0  # 1 = best; set once the ranking is sorted
        self.steps_per_usd: float = steps_per_usd
        self._total = total  # the float total the score came from; breaks ties in the score
        self._arrival = arrival  # position in the catalogue; breaks the last ties
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
            step_s = pricing.tokens_per_step / self.throughput.tokens_per_s
            self._projection = pricing.costs.estimate(o, step_s, o.is_bid)
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
    def interconnect(self) -> str:
        """How the box's GPUs talk to each other, as its listing says; "" for one GPU."""
        return interconnect(self.offer)

    @property
    def why(self) -> tuple[str, ...]:
        o, p, c, t = self.offer, self.projection, self.cost, self.throughput
        listed = "GPU" if not self._pricing.speeds.multi_gpu else f"for the whole box ({o.num_gpus} GPUs)"
        lines = [
            f"{t.tokens_per_s:,.0f} tok/s, {p.step_s:.0f} s/step ({t.source})",
            f"{usd(o.gpu_usd_per_hour or o.total_usd_per_hour)}/h listed {listed}; {usd(c.usd_per_hour)}/h all-in "
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
                    "interconnect": e.interconnect,
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

    def estimate_tokens_per_s(self, o: OfferRecord) -> float | None:
        cc = o.compute_capability
        return self.speeds.estimate_tokens_per_s(
            o, self.listed_ratio.get(cc, self.any_listed), self.dlperf_ratio.get(cc, self.any_dlperf))


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
    prices: Sequence[OfferPrices] | None = None,
) -> Ranking:
    """Every offer either ranked (best steps per dollar first) or excluded with all of its reasons.

    recipe and filters default to the product's defaults; calibration to the seeded throughput table. prices, one
    per offer in the same order: the float twins of their Decimal prices (fleet.models.Offer stores them when the
    offers are refreshed), so that scoring converts no Decimal; without them each scored offer's are worked out.
    The ranking is the same either way.
    """
    if prices is not None and len(prices) != len(offers):
        raise ValueError(f"rank_offers: {len(prices)} prices for {len(offers)} offers")
    with _no_cycle_collection():
        return _rank(offers, recipe, filters, calibration, prices)


@contextmanager
def _no_cycle_collection():
    """Ranking 10,000 offers allocates tens of thousands of objects that outlive the call (the RankedOffers) or die
    young without a cycle among them; a cyclic collection that those allocations start walks the objects of the
    process and frees nothing (8-15% of a ranking in bench/ranking.py). It runs after the ranking instead. The switch
    is process-wide: a ranking in another thread meanwhile finds it off and leaves it so, this one turns it back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rank(offers, recipe: Recipe | None, filters: OfferFilters | None, calibration: Calibration | None,
          prices: Sequence[OfferPrices] | None) -> Ranking:
    recipe = recipe or Recipe()
    filters = filters or OfferFilters()
    compiled = compile_filters(filters, recipe)
    first_failed = compiled.first_failed
    speeds = ThroughputModel(calibration or SEED_CALIBRATION, recipe)
    costs = CostModel(recipe)
    pricing = _Pricing(speeds, costs, recipe)
    calibrated = speeds.calibrated
    multi_gpu = speeds.multi_gpu  # a recipe on several GPUs: the interconnect joins the key (ThroughputModel.key)
    one_gpu_share = speeds.one_gpu_share
    step_figures = costs.step_figures
    total_usd = costs.total_usd_scorer()
    tokens_per_step = recipe.tokens_per_step
    steps = recipe.total_steps
    inf = math.inf

    # Many offers share a GPU model and count, so a step time and what follows from it are worked out once per
    # (gpu_name, compute_capability, num_gpus), and the NVLink its listing says for a recipe on several:
    # (throughput, step figures, achieved model TFLOP/s per GPU), or None when no calibration covers it.
    per_model: dict[tuple, tuple | None] = {}
    excluded = []
    ranked = []  # RankedOffers in scoring order, sorted below
    unbounded = []  # scored, but at no finite cost
    calibrated_offers = []  # in catalogue order, to anchor the estimates on
    uncalibrated, uncalibrated_at = [], []  # offers and their catalogue positions (two lists: no tuple apiece)
    for i, o in enumerate(offers):
        m = first_failed(o)
        if m:
            excluded.append(Exclusion(o, m, compiled))
            continue
        key = (o.gpu_name, o.compute_capability, o.num_gpus, o.nvlink_gb_s) if multi_gpu else (
            o.gpu_name, o.compute_capability, o.num_gpus)
        try:
            known = per_model[key]
        except KeyError:
            t = calibrated(o)
            known = per_model[key] = None if t is None else (
                t, step_figures(tokens_per_step / t.tokens_per_s), model_tflops_of(one_gpu_share(o, t.tokens_per_s),
                                                                                   recipe))
        if known is None:
            uncalibrated.append(o)
            uncalibrated_at.append(i)
            continue
        calibrated_offers.append(o)
        total = total_usd(o, known[1], offer_prices(o) if prices is None else prices[i])
        if total < inf:  # also false for NaN
            ranked.append(RankedOffer(o, steps / total if total > 0 else 0.0, total, i, known[0], pricing))
        else:
            unbounded.append(o)

    if uncalibrated:
        # Anchor spec-sheet figures on what calibrated offers in this same catalogue list, whatever unit the
        # marketplace uses for total_flops and dlperf; per architecture where one is calibrated, because the kernel
        # path (and so the achieved share of the listed figure) follows the architecture.
        listed_pairs, dlperf_pairs = {}, {}
        for o in calibrated_offers:
            per_gpu = per_model[speeds.key(o)][2]
            if o.total_flops:
                listed_pairs.setdefault(o.compute_capability, []).append((per_gpu, o.total_flops / o.num_gpus))
            if o.dlperf:
                dlperf_pairs.setdefault(o.compute_capability, []).append((per_gpu, o.dlperf / o.num_gpus))
        pricing.listed_ratio = {cc: anchor_ratio(pairs) for cc, pairs in listed_pairs.items()}
        pricing.dlperf_ratio = {cc: anchor_ratio(pairs) for cc, pairs in dlperf_pairs.items()}
        pricing.any_listed = anchor_ratio([pair for pairs in listed_pairs.values() for pair in pairs])
        pricing.any_dlperf = anchor_ratio([pair for pairs in dlperf_pairs.values() for pair in pairs])
        estimate = pricing.estimate_tokens_per_s
        figures_at = {}  # step figures per estimated speed: offers capped at the best card share one
        for i, o in zip(uncalibrated_at, uncalibrated):
            speed = estimate(o)
            if speed is None or not speed > 0:
                excluded.append(Exclusion(o, NO_THROUGHPUT, compiled))
                continue
            try:
                figures = figures_at[speed]
            except KeyError:
                figures = figures_at[speed] = step_figures(tokens_per_step / speed)
            total = total_usd(o, figures, offer_prices(o) if prices is None else prices[i])
            if total < inf:
                # throughput None: worked out when read, from the same anchors (RankedOffer.throughput)
                ranked.append(RankedOffer(o, steps / total if total > 0 else 0.0, total, i, None, pricing))
            else:
                unbounded.append(o)

    excluded.extend([Exclusion(o, UNBOUNDED_COST, compiled) for o in unbounded])
    _sort(ranked)
    for rank, entry in enumerate(ranked, 1):
        entry.rank = rank
    return Ranking(tuple(ranked), tuple(excluded), recipe, filters)


_score = attrgetter("steps_per_usd")


def _tie_order(e: RankedOffer):
    o = e.offer
    return e._total, o.provider, o.offer_id, o.is_bid, e._arrival


def _sort(ranked: list[RankedOffer]) -> None:
    """Best score first, then the cheaper run, then a stable id.

    Sorting on the float score alone is several times faster than sorting tuples and allocates nothing per offer;
    equal scores are rare, so only runs of them are put in tie order afterwards.
    """
    ranked.sort(key=_score, reverse=True)
    scores = [e.steps_per_usd for e in ranked]
    if len(set(scores)) == len(scores):
        return
    start = 0
    for end in range(1, len(ranked) + 1):
        if end == len(ranked) or scores[end] != scores[start]:
            if end - start > 1:
                ranked[start:end] = sorted(ranked[start:end], key=_tie_order)
            start = end
