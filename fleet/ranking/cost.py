"""What a whole run costs on one offer, not what its hour costs: start-up, training, traffic and expected restarts
(docs/fleet.md, "fleet/ranking/cost.py")."""

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import NamedTuple

import numpy as np

from fleet.providers.records import OfferRecord

from .workload import Workload

HOURS_PER_MONTH = 720  # vast.ai prices storage per GB per 30-day month and bills it by the hour
MEGABITS_PER_GB = 8000  # decimal GB, as marketplaces bill traffic
LOSS_DETECTION_S = 60.0  # the recovery design's goal for noticing a lost host
BID_RECLAIM_PER_HOUR = 0.2  # interruptible boxes: two reclaims in one session (docs/field-notes.md)
MIN_RESTART_DENOMINATOR = 0.1  # keeps the restart factor finite for hosts that lose more than they train
# Providers that bill storage only until the box is "running" (vast.ai: storage from creation, GPU time from running):
# the boot and the image pull cost the disk alone there; the model download runs in the box, at the full price.
STORAGE_ONLY_WHILE_LOADING = frozenset({"vast"})

_CENT_HUNDREDTHS = Decimal("0.0001")
_SECONDS_PER_HOUR = Decimal(3600)
_HOURS_PER_MONTH = Decimal(HOURS_PER_MONTH)
_new_projection = _new_prices = tuple.__new__  # skips NamedTuple's keyword handling on the hot path


class OfferPrices(NamedTuple):
    """The float twins of the Decimal prices the scoring reads, in the order `total_usd_columns` reads them. The
    offers refresh stores them beside the Decimals (fleet.models.Offer), so a ranking of thousands of offers converts
    no Decimal (rank_offers(prices=)); `offer_prices` works them out for records that come without."""

    usd_per_hour: float  # the box's $/h: the GPU price, or the total where the listing gives none
    storage_usd_per_gb_month: float
    inet_down_usd_per_gb: float
    inet_up_usd_per_gb: float


def offer_prices(offer: OfferRecord) -> OfferPrices:
    return _new_prices(OfferPrices, (
        float(offer.gpu_usd_per_hour or offer.total_usd_per_hour), float(offer.storage_usd_per_gb_month),
        float(offer.inet_down_usd_per_gb), float(offer.inet_up_usd_per_gb)))


class Projection(NamedTuple):
    """The float figures the ranking sorts on, and what breakdown needs to redo the money in Decimal."""

    step_s: float
    startup_s: float
    train_s: float  # steps x step time + upload stalls + the final upload
    checkpoints: int
    loss_rate_per_hour: float
    expected_restarts: float
    lost_s_per_restart: float
    wall_hours: float  # start-up + training + expected restarts
    total_usd: float  # float twin of CostBreakdown.total_usd, for scoring
    storage_only_s: float = 0.0  # of each start-up, the boot and image pull that bill no GPU time (0: all of it does)


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """Dollars for the whole run, each rounded to $0.0001; total_usd is their sum."""

    gpu_usd: Decimal  # GPU $/h over the training hours
    disk_usd: Decimal  # rented disk over the training hours
    startup_usd: Decimal  # GPU + disk over the billed start-up minutes (disk alone while loading, where so billed)
    download_usd: Decimal  # the model, once
    upload_usd: Decimal  # every checkpoint
    restart_usd: Decimal  # expected host losses
    total_usd: Decimal
    usd_per_hour: Decimal  # total over the projected wall time: the full hourly cost


class CostModel:
    """Per-recipe constants computed once; then one call per offer."""

    def __init__(self, recipe: Workload):
        self.recipe = recipe
        self.steps = recipe.total_steps
        self.interval_s = float(recipe.checkpoint_interval_s)
        self.extra_checkpoints = len(recipe.phases) - 1  # each phase ends with one, beside the interval ones
        self.checkpoint_gb = float(recipe.checkpoint_gb)
        self.checkpoint_megabits = recipe.checkpoint_gb * MEGABITS_PER_GB
        self.fetch_megabits = (recipe.image_gb + recipe.model_download_gb) * MEGABITS_PER_GB
        self.image_megabits = recipe.image_gb * MEGABITS_PER_GB
        self.boot_s = float(recipe.boot_s)
        self.download_gb = float(recipe.model_download_gb)
        self.disk_gb_months_per_hour = recipe.rent_disk_gb / HOURS_PER_MONTH
        self._download_gb = _dec(recipe.model_download_gb)
        self._checkpoint_gb = _dec(recipe.checkpoint_gb)
        self._rent_disk_gb = _dec(recipe.rent_disk_gb)

    def estimate(self, offer: OfferRecord, step_s: float, interruptible: bool = False) -> Projection:
        down = offer.inet_down_mbps
        up = offer.inet_up_mbps
        startup_s = self.boot_s + (self.fetch_megabits / down if down > 0 else math.inf)
        upload_s = self.checkpoint_megabits / up if up > 0 else math.inf
        compute_s = self.steps * step_s
        interval = self.interval_s
        interval_checkpoints = math.ceil(compute_s / interval) if compute_s > 0 else 0
        checkpoints = interval_checkpoints + self.extra_checkpoints
        stall_s = (upload_s - interval) * interval_checkpoints if upload_s > interval else 0.0
        train_s = compute_s + stall_s + upload_s

        gpu_h = float(offer.gpu_usd_per_hour or offer.total_usd_per_hour)
        disk_h = float(offer.storage_usd_per_gb_month) * self.disk_gb_months_per_hour
        box_h = gpu_h + disk_h
        download_usd = self.download_gb * float(offer.inet_down_usd_per_gb)
        storage_only_s = self.boot_s + self.image_megabits / down \
            if down > 0 and offer.provider in STORAGE_ONLY_WHILE_LOADING else 0.0
        free_h = storage_only_s / 3600  # GPU hours of each start-up that are not billed

        reliability = offer.reliability
        rate = -math.log(reliability) if 0 < reliability < 1 else (0.0 if reliability >= 1 else math.inf)
        if interruptible:
            rate += BID_RECLAIM_PER_HOUR
        lost_s = (interval if interval < compute_s else compute_s) + LOSS_DETECTION_S + startup_s
        billed_h = (startup_s + train_s) / 3600
        total = box_h * billed_h - gpu_h * free_h + download_usd + checkpoints * self.checkpoint_gb * float(
            offer.inet_up_usd_per_gb)
        restarts = restart_h = 0.0
        if rate:
            # restarts are themselves exposed to loss: rate x exposed / (1 - rate x lost), kept finite
            exposed = 1.0 - rate * lost_s / 3600
            restarts = rate * billed_h / (exposed if exposed > MIN_RESTART_DENOMINATOR else MIN_RESTART_DENOMINATOR)
            restart_h = restarts * lost_s / 3600
            total += restart_h * box_h - (restarts * (gpu_h * free_h) if free_h else 0.0) + restarts * download_usd
        return _new_projection(Projection, (step_s, startup_s, train_s, checkpoints, rate, restarts, lost_s,
                                            billed_h + restart_h, total, storage_only_s))

    def total_usd_columns(self, step_s: np.ndarray, down_mbps: np.ndarray, up_mbps: np.ndarray,
                          reliability: np.ndarray, interruptible: np.ndarray, prices: np.ndarray,
                          storage_only_while_loading: np.ndarray | None = None) -> np.ndarray:
        """`estimate(offer, step_s, interruptible).total_usd` for many offers at once, bit for bit, one value per offer
        in each column (`storage_only_while_loading`: each offer's provider in STORAGE_ONLY_WHILE_LOADING; left out,
        none is); a bandwidth of zero gives an infinite total without a warning."""
        interval = self.interval_s
        box_usd_per_hour, storage_usd_per_gb_month, down_usd_per_gb, up_usd_per_gb = prices.T
        with np.errstate(all="ignore"):
            compute_s = self.steps * step_s
            interval_checkpoints = np.where(compute_s > 0, np.ceil(compute_s / interval), 0.0)
            checkpoints = interval_checkpoints + self.extra_checkpoints
            startup_s = self.boot_s + np.where(down_mbps > 0, self.fetch_megabits / down_mbps, math.inf)
            upload_s = np.where(up_mbps > 0, self.checkpoint_megabits / up_mbps, math.inf)
            stall_s = np.where(upload_s > interval, (upload_s - interval) * interval_checkpoints, 0.0)
            train_s = compute_s + stall_s + upload_s
            box_h = box_usd_per_hour + storage_usd_per_gb_month * self.disk_gb_months_per_hour
            download_usd = self.download_gb * down_usd_per_gb
            loading = np.zeros(len(step_s), bool) if storage_only_while_loading is None else storage_only_while_loading
            free_h = np.where(loading & (down_mbps > 0), self.boot_s + self.image_megabits / down_mbps, 0.0) / 3600
            rate = loss_rates(reliability)
            rate = np.where(interruptible, rate + BID_RECLAIM_PER_HOUR, rate)
            lost_s = np.where(interval < compute_s, interval, compute_s) + LOSS_DETECTION_S + startup_s
            billed_h = (startup_s + train_s) / 3600
            total = box_h * billed_h - box_usd_per_hour * free_h + download_usd + checkpoints * self.checkpoint_gb * \
                up_usd_per_gb
            # restarts are themselves exposed to loss: rate x exposed / (1 - rate x lost), kept finite
            exposed = 1.0 - rate * lost_s / 3600
            restarts = rate * billed_h / np.where(exposed > MIN_RESTART_DENOMINATOR, exposed, MIN_RESTART_DENOMINATOR)
            restart_h = restarts * lost_s / 3600
            unbilled = np.where(free_h > 0, restarts * (box_usd_per_hour * free_h), 0.0)  # no inf x 0 where none is
            return np.where(rate != 0, total + (restart_h * box_h - unbilled + restarts * download_usd), total)

    def breakdown(self, offer: OfferRecord, p: Projection) -> CostBreakdown:
        gpu_h = offer.gpu_usd_per_hour or offer.total_usd_per_hour
        disk_h = offer.storage_usd_per_gb_month * self._rent_disk_gb / _HOURS_PER_MONTH
        box_h = gpu_h + disk_h
        train_h = _dec(p.train_s) / _SECONDS_PER_HOUR
        startup_h = _dec(p.startup_s) / _SECONDS_PER_HOUR
        free_gpu = gpu_h * _dec(p.storage_only_s) / _SECONDS_PER_HOUR  # the GPU hours loading does not bill
        download = self._download_gb * offer.inet_down_usd_per_gb
        restarts = _dec(p.expected_restarts)

        gpu = _money(gpu_h * train_h)
        disk = _money(disk_h * train_h)
        startup = _money(box_h * startup_h - free_gpu)
        download_usd = _money(download)
        upload = _money(p.checkpoints * self._checkpoint_gb * offer.inet_up_usd_per_gb)
        restart = _money(restarts * (box_h * _dec(p.lost_s_per_restart) / _SECONDS_PER_HOUR - free_gpu + download)) \
            if restarts else Decimal("0.0000")
        total = gpu + disk + startup + download_usd + upload + restart
        hours = _dec(p.wall_hours)
        return CostBreakdown(
            gpu_usd=gpu,
            disk_usd=disk,
            startup_usd=startup,
            download_usd=download_usd,
            upload_usd=upload,
            restart_usd=restart,
            total_usd=total,
            usd_per_hour=_money(total / hours) if hours else total,
        )


def loss_rates(reliability: np.ndarray) -> np.ndarray:
    """`estimate`'s loss rate per hour for each reliability: -log(reliability), 0 at 1 and above, infinite at 0 and
    below. The log is math.log's, one value at a time: numpy's own may differ from it in the last bit."""
    rates = np.where(reliability >= 1, 0.0, math.inf)
    between = (reliability > 0) & (reliability < 1)
    rates[between] = -np.fromiter(map(math.log, reliability[between].tolist()), float, np.count_nonzero(between))
    return rates


def _dec(value) -> Decimal:
    # Through the float's shortest text, so 72000.0 s stays exactly 72000 and hand-worked examples stay exact.
    return Decimal(repr(float(value))) if not isinstance(value, (int, Decimal)) else Decimal(value)


def _money(amount: Decimal) -> Decimal:
    return amount.quantize(_CENT_HUNDREDTHS, rounding=ROUND_HALF_UP)
