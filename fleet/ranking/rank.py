"""rank_offers: which offer runs this recipe for the fewest dollars (steps per dollar of the whole run), and why every
other offer does not. Pure and fast (docs/fleet.md, "fleet/ranking/rank.py")."""

import gc
import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from itertools import chain, compress, repeat
from operator import attrgetter, truth

import numpy as np

from fleet.providers.records import OfferRecord

from . import memory
from .cost import STORAGE_ONLY_WHILE_LOADING, CostBreakdown, CostModel, OfferPrices, Projection, offer_prices
from .filters import NO_THROUGHPUT, RANKING_BITS, UNBOUNDED_COST, CompiledFilters, OfferFilters, compile_filters, usd
from .workload import Workload
from .speeds import OfferSpeeds, column
from .throughput import SEED_CALIBRATION, Calibration, Throughput, ThroughputModel, interconnect


class RankedOffer:
    """One offer that passed, with its score. Immutable by convention. Only the score is worked out while ranking;
    the throughput's words, the float projection and the Decimal money (`cost`) are worked out on first read, so
    ranking 10,000 offers pays for them only on the ones a page shows."""

    __slots__ = ("offer", "rank", "steps_per_usd", "_total", "_throughput", "_planned", "_pricing", "_projection",
                 "_cost")

    def __init__(self, offer, steps_per_usd, total, throughput, pricing, rank):
        self.offer: OfferRecord = offer
        self.rank: int = rank  # 1 = best
        self.steps_per_usd: float = steps_per_usd
        self._total = total  # the float total the score came from
        self._throughput = throughput  # None for an estimate until read: its words cost more than its number
        self._planned = False  # the memory plan's cost on this card not yet taken into it
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
        if not self._planned:
            base = self._throughput if self._throughput is not None else self._pricing.estimate(self.offer)
            self._throughput = self._pricing.planned(self.offer, base)
            self._planned = True
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
            f"start-up {p.startup_s / 60:.0f} min billed ({usd(c.startup_usd)}"
            f"{f', the first {p.storage_only_s / 60:.0f} storage only' if p.storage_only_s else ''}); "
            f"traffic {usd(c.download_usd)} model "
            f"download + {usd(c.upload_usd)} for {p.checkpoints} checkpoints",
        ]
        if p.expected_restarts:
            lines.append(
                f"reliability {o.reliability:.3f}: {p.expected_restarts:.2f} expected restarts ({usd(c.restart_usd)})")
        if o.is_bid:
            lines.append("interruptible (bid): may be reclaimed mid-phase; fine for smoke tests")
        if t.estimated:
            lines.append("throughput is an estimate: no run has measured this GPU")
        if (plan := memory.plan_on(self._pricing.recipe, o.gpu_ram_gb)) is not None:
            host = f", {plan.host_gib:.1f} GiB pinned on the host" if plan.host_gib else ""
            tight = "" if plan.roomy else f" (under the {plan.kept_gib:.1f} kept: no plan leaves it here)"
            lines.append(f"memory plan: {plan.name}; {plan.total_gib:.1f} of {plan.card_gib:.1f} GiB usable, "
                         f"{plan.headroom_gib:.1f} GiB headroom{tight}{host}")
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


class RankedEntries(Sequence):
    """A ranking's ranked offers, best first, each made a RankedOffer when it is first read; iterating makes them all.
    Equal to any tuple or list of the same RankedOffers."""

    __slots__ = ("_order", "_offers", "_scores", "_totals", "_models", "_throughputs", "_pricing", "_made",
                 "_missing")

    def __init__(self, order: list[int], offers: list[OfferRecord], scores: list[float], totals: list[float],
                 models: list[int], throughputs: list[Throughput | None], pricing: "_Pricing"):
        self._order = order
        self._offers = offers
        self._scores = scores
        self._totals = totals
        self._models = models  # each offer's GPU model, and each model's calibrated Throughput (None: estimated)
        self._throughputs = throughputs
        self._pricing = pricing
        self._made: list[RankedOffer | None] = [None] * len(order)
        self._missing = bool(order)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(map(self._entry, range(*index.indices(len(self._made)))))
        return self._entry(range(len(self._made))[index])  # IndexError and negative indices as a tuple has them

    def __iter__(self):
        if self._missing:
            for rank, entry in enumerate(self._made):
                if entry is None:
                    self._entry(rank)
            self._missing = False
        return iter(self._made)

    def __eq__(self, other):
        if not isinstance(other, (RankedEntries, tuple, list)):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __repr__(self):
        return f"<RankedEntries of {len(self)} offers>"

    def _entry(self, place: int) -> RankedOffer:
        entry = self._made[place]
        if entry is None:
            i = self._order[place]
            entry = self._made[place] = RankedOffer(
                self._offers[i], self._scores[i], self._totals[i], self._throughputs[self._models[i]], self._pricing,
                place + 1)
        return entry


@dataclass(frozen=True)
class Ranking:
    entries: Sequence[RankedOffer]  # best first (RankedEntries)
    excluded: tuple[Exclusion, ...]  # in the order the offers came
    recipe: Workload
    filters: OfferFilters

    def find(self, offer_id: str, *, provider: str | None = None, is_bid: bool | None = None):
        """The RankedOffer or Exclusion for one offer, or None if it was not in the catalogue."""
        items: tuple[RankedOffer | Exclusion, ...] = (*self.entries, *self.excluded)
        for item in items:
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

    __slots__ = ("speeds", "costs", "recipe", "tokens_per_step", "tokens_per_run", "listed_ratio", "dlperf_ratio",
                 "any_listed", "any_dlperf")

    def __init__(self, speeds: ThroughputModel, costs: CostModel, recipe: Workload):
        self.speeds = speeds
        self.recipe = recipe
        self.costs = costs
        self.tokens_per_step = recipe.tokens_per_step
        self.tokens_per_run = recipe.total_steps * recipe.tokens_per_step
        # spec-sheet anchors per compute capability, and across all of them (speeds.OfferSpeeds)
        self.listed_ratio: dict[int, float | None] = {}
        self.dlperf_ratio: dict[int, float | None] = {}
        self.any_listed: float | None = None
        self.any_dlperf: float | None = None

    def anchor_on(self, speeds: OfferSpeeds) -> None:
        """The anchors the ranking's estimates took, for the words of each estimated offer's throughput."""
        self.listed_ratio, self.dlperf_ratio = speeds.listed_ratio, speeds.dlperf_ratio
        self.any_listed, self.any_dlperf = speeds.any_listed, speeds.any_dlperf

    def planned(self, o: OfferRecord, t: Throughput | None) -> Throughput | None:
        """`t` at the speed of the memory plan the trainer would take on this offer's card (fleet/ranking/memory.py),
        as the ranking scored it."""
        plan = memory.plan_on(self.recipe, o.gpu_ram_gb)
        if t is None or plan is None or plan.speed == 1.0:
            return t
        return Throughput(t.tokens_per_s * plan.speed, t.kernel_path, t.estimated,
                          f"{t.source}; x{plan.speed:.2f} for {plan.name}")

    def estimate(self, o: OfferRecord) -> Throughput | None:
        cc = o.compute_capability
        return self.speeds.estimate(
            o, self.listed_ratio.get(cc, self.any_listed), self.dlperf_ratio.get(cc, self.any_dlperf))


def best_offer(ranked: list[OfferRecord], avoid_machines=frozenset(), avoid_offers=frozenset()
               ) -> OfferRecord | None:
    """The best-ranked offer (records, best first) not on a machine to avoid and not already taken (provider,
    offer_id), or None."""
    return next((o for o in ranked if not (o.machine_id and o.machine_id in avoid_machines)
                 and (o.provider, o.offer_id) not in avoid_offers), None)


def rank_offers(
    offers,
    recipe: Workload | None = None,
    filters: OfferFilters | None = None,
    *,
    calibration: Calibration | None = None,
    prices: Sequence[OfferPrices] | None = None,
) -> Ranking:
    """Every offer either ranked (best steps per dollar first) or excluded with all of its reasons; `prices`, one per
    offer, are the float twins of their Decimal prices, worked out when absent."""
    if prices is not None and len(prices) != len(offers):
        raise ValueError(f"rank_offers: {len(prices)} prices for {len(offers)} offers")
    with _no_cycle_collection():
        return _rank(offers, recipe, filters, calibration, prices)


@contextmanager
def _no_cycle_collection():
    """Runs the ranking with the cyclic garbage collector off and turns it back on after, since its allocations hold no
    cycles (docs/fleet.md, "fleet/ranking/rank.py")."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rank(offers, recipe: Workload | None, filters: OfferFilters | None, calibration: Calibration | None,
          prices: Sequence[OfferPrices] | None) -> Ranking:
    recipe = recipe or Workload()
    filters = filters or OfferFilters()
    compiled = compile_filters(filters, recipe)
    speeds = ThroughputModel(calibration or SEED_CALIBRATION, recipe)
    costs = CostModel(recipe)
    pricing = _Pricing(speeds, costs, recipe)

    failed = list(map(compiled.first_failed, offers))
    excluded = list(map(Exclusion, compress(offers, failed), filter(None, failed), repeat(compiled)))
    at = [i for i, m in enumerate(failed) if not m]  # the catalogue positions of the offers every filter passes
    passed = list(map(offers.__getitem__, at))

    # Scoring, a column at a time over the offers that passed: the throughput, then the float total of the run
    # (CostModel.total_usd_columns) on the stored float prices, or on those of each offer's Decimals without them.
    offer_speeds = OfferSpeeds(passed, speeds, recipe)
    pricing.anchor_on(offer_speeds)
    rows = list(map(offer_prices, passed)) if prices is None else list(map(prices.__getitem__, at))
    with np.errstate(divide="ignore", invalid="ignore"):
        # Each card at the speed of the memory plan the trainer would take on it (checkpointing, optimizer state).
        step_s = recipe.tokens_per_step / (offer_speeds.tokens_per_s
                                           * memory.speed_column(recipe, column(passed, "gpu_ram_gb")))
        totals = costs.total_usd_columns(
            step_s, column(passed, "inet_down_mbps"), column(passed, "inet_up_mbps"), column(passed, "reliability"),
            np.fromiter(map(truth, map(attrgetter("is_bid"), passed)), bool, len(passed)),
            np.fromiter(chain.from_iterable(rows), float, 4 * len(rows)).reshape(len(rows), 4),
            np.fromiter((o.provider in STORAGE_ONLY_WHILE_LOADING for o in passed), bool, len(passed)))
        calibrated, estimated = offer_speeds.calibrated, ~offer_speeds.calibrated & (offer_speeds.tokens_per_s > 0)
    bounded = totals < math.inf  # also false for NaN
    # after the filters' exclusions: the offers with no estimate, then those the cost model cannot bound, in the
    # order they were scored (the calibrated ones first)
    for unpriced, bit in ((~calibrated & ~estimated, NO_THROUGHPUT), (calibrated & ~bounded, UNBOUNDED_COST),
                          (estimated & ~bounded, UNBOUNDED_COST)):
        excluded.extend(map(Exclusion, compress(passed, unpriced.tolist()), repeat(bit), repeat(compiled)))

    with np.errstate(divide="ignore", over="ignore"):
        scores = np.where(totals > 0, recipe.total_steps / totals, 0.0)
    order = _order(np.flatnonzero((calibrated | estimated) & bounded), scores, totals, passed, at)
    entries = RankedEntries(order.tolist(), passed, scores.tolist(), totals.tolist(), offer_speeds.models.tolist(),
                            offer_speeds.throughputs, pricing)
    return Ranking(entries, tuple(excluded), recipe, filters)


def _order(ranked: np.ndarray, scores: np.ndarray, totals: np.ndarray, passed, at) -> np.ndarray:
    """The ranked offers' places, best score first, then the cheaper run, then a stable id.

    Sorting on the float score alone allocates nothing per offer; equal scores are rare, so only runs of them are
    put in tie order afterwards.
    """
    order = ranked[np.argsort(-scores[ranked], kind="stable")]
    best = scores[order]
    starts = np.flatnonzero(best[1:] != best[:-1]) + 1  # where each run of equal scores starts, after the first
    if len(starts) == len(order) - 1:
        return order

    def tie_order(j):
        o = passed[j]
        return totals[j], o.provider, o.offer_id, o.is_bid, at[j]

    for start, end in zip([0, *starts.tolist()], [*starts.tolist(), len(order)], strict=True):
        if end - start > 1:
            order[start:end] = sorted(order[start:end].tolist(), key=tie_order)
    return order
