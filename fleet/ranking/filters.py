"""Hard filters: the offers a run must never land on, each with the reason a user reads.

Every filter here exists because a box failed without it (seed report): GPU names vary ("H200" vs "H200 NVL"), so
tiers are memory ranges; a driver older than the image's CUDA rents fine and then dies with CUDA error 803; 250 GB
holds the 67 GB base plus a merged and an FP8 copy; a slow uplink turns every 7 GB checkpoint into idle GPU hours;
advertised bandwidth is local, so hosts must sit near the checkpoint bucket; a 0.99 reliability floor empties the
cheap tier, so the floor is 0.95 and the ranking prices the rest (see cost.py); interruptible boxes get reclaimed
mid-phase, so bids are opt-in. The price cap stops "cheapest rentable" from landing on $1.90-2.50/h boxes.

An excluded offer gets every reason that applies, not just the first, so a user who looks an offer up sees all of
what is wrong with it. Fields an offer leaves blank exclude it with "... unknown" rather than pass or crash, and so
do NaN and infinite values, whichever way they reached a record (a listing, or a row stored before they were
refused).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation

from fleet.providers.records import OfferRecord

from .recipe import Recipe
from .values import number, whole

# Per-GPU memory ranges, matched on memory because marketplaces name the same card several ways.
GPU_TIERS: dict[str, tuple[str, float, float]] = {
    "rtx_pro_6000": ("RTX PRO 6000", 90.0, 100.0),
    "h200": ("H200", 130.0, 150.0),
    "b200": ("B200", 170.0, 190.0),
}
_TIER_ALIASES = {"h200_nvl": "h200", "rtx_pro_6000_ws": "rtx_pro_6000", "rtx_pro_6000_blackwell": "rtx_pro_6000"}

# Regions near a checkpoint bucket, as country codes (vast.ai geolocation ends with one).
REGIONS: dict[str, frozenset[str]] = {
    "EU": frozenset(
        "AT BE BG HR CY CZ DK EE FI FR DE GR HU IE IT LV LT LU MT NL PL PT RO SK SI ES SE IS LI NO CH GB".split()
    ),
    "NA": frozenset("US CA MX".split()),
    "APAC": frozenset("JP KR SG TW HK AU NZ IN".split()),
}

_ANY = ("any", "*", "")


@dataclass(frozen=True)
class OfferFilters:
    gpu_tiers: tuple[str, ...] = ("rtx_pro_6000", "h200", "b200")  # () = any tier
    vram_min_gb: float | None = None  # set either bound: an explicit range that replaces the tiers
    vram_max_gb: float | None = None
    max_usd_per_hour: Decimal | None = Decimal("1.30")  # on the offer's total $/h; None = no cap
    min_driver_version: str = "570"  # the worker image's CUDA 12.8 needs driver >= 570
    min_cuda: float = 12.8  # compared with the offer's cuda_max
    min_disk_gb: float = 250.0
    min_inet_down_mbps: float = 250.0
    min_inet_up_mbps: float = 200.0
    locations: frozenset[str] = field(default_factory=frozenset)  # country codes and/or regions; empty = any
    min_reliability: float = 0.95
    require_verified: bool = False
    allow_bids: bool = False
    min_gpus: int = 1
    max_gpus: int | None = 1  # None = no maximum

    def __post_init__(self):
        # Normalise here too, so filters built in code are checked exactly like a saved profile.
        set_ = object.__setattr__
        set_(self, "gpu_tiers", _tiers(self.gpu_tiers))
        set_(self, "vram_min_gb", _optional_number("vram_min_gb", self.vram_min_gb))
        set_(self, "vram_max_gb", _optional_number("vram_max_gb", self.vram_max_gb))
        if self.vram_min_gb is not None and self.vram_max_gb is not None and self.vram_min_gb > self.vram_max_gb:
            raise ValueError(f"vram_min_gb {self.vram_min_gb:g} is above vram_max_gb {self.vram_max_gb:g}")
        set_(self, "max_usd_per_hour", _optional_money("max_usd_per_hour", self.max_usd_per_hour))
        version = str(self.min_driver_version).strip()
        if version and parse_version(version) is None:
            raise ValueError(f"min_driver_version must look like 570 or 570.124.06, got {self.min_driver_version!r}")
        set_(self, "min_driver_version", version)
        for name in ("min_cuda", "min_disk_gb", "min_inet_down_mbps", "min_inet_up_mbps"):
            set_(self, name, _number(name, getattr(self, name)))
        reliability = _number("min_reliability", self.min_reliability)
        if reliability > 1:
            raise ValueError(f"min_reliability must be between 0 and 1, got {self.min_reliability!r}")
        set_(self, "min_reliability", reliability)
        set_(self, "locations", _locations(self.locations))
        for name in ("require_verified", "allow_bids"):
            set_(self, name, _flag(name, getattr(self, name)))
        set_(self, "min_gpus", _count("min_gpus", self.min_gpus))
        if self.max_gpus is None or self.max_gpus == "":
            set_(self, "max_gpus", None)
        else:
            set_(self, "max_gpus", _count("max_gpus", self.max_gpus))
            if self.max_gpus < self.min_gpus:
                raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")

    def to_dict(self) -> dict:
        """JSON-ready: money as a string, sets as sorted lists."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(gpu_tiers=list(self.gpu_tiers), locations=sorted(self.locations),
                    max_usd_per_hour=None if self.max_usd_per_hour is None else str(self.max_usd_per_hour))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "OfferFilters":
        """Missing keys take their defaults; unknown keys and bad values raise ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError(f"filters must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown filter(s): {', '.join(unknown)}")
        return cls(**data)

    @property
    def vram_ranges(self) -> tuple[tuple[float, float], ...]:
        if self.vram_min_gb is not None or self.vram_max_gb is not None:
            low = self.vram_min_gb if self.vram_min_gb is not None else 0.0
            high = self.vram_max_gb if self.vram_max_gb is not None else math.inf
            return ((low, high),)
        return tuple((GPU_TIERS[t][1], GPU_TIERS[t][2]) for t in self.gpu_tiers)

    @property
    def allowed_countries(self) -> frozenset[str]:
        countries = set()
        for item in self.locations:
            countries |= REGIONS.get(item, {item})
        return frozenset(countries)


def parse_version(text: str) -> tuple[int, ...] | None:
    """"535.129.03" -> (535, 129, 3); None when it is blank or not dotted numbers."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def version_at_least(version: tuple[int, ...], needed: tuple[int, ...]) -> bool:
    # Part by part, missing parts count as zero: "570" == "570.0.0" < "570.124".
    width = max(len(version), len(needed))
    return version + (0,) * (width - len(version)) >= needed + (0,) * (width - len(needed))


@dataclass(frozen=True)
class Filter:
    """One hard filter: its name (its bit is its place in FILTERS) and the words a user reads when an offer fails
    it. What it tests is in `_tests`, in the same order."""

    name: str
    words: Callable[[OfferRecord, OfferFilters, Recipe], str]


def _said(text: str):
    return lambda o, f, r: text


def _known(value) -> bool:
    """A usable number: not None, NaN or an infinity (a float or a Decimal), and a number at all."""
    try:
        return math.isfinite(value)
    except (TypeError, ValueError):  # None, no number at all, or a signalling NaN
        return False


# The prices the cost model reads, with the words a user reads when one is blank; the total comes first.
_PRICES = (("total_usd_per_hour", "price"), ("gpu_usd_per_hour", "GPU price"),
           ("storage_usd_per_gb_month", "storage price"), ("inet_down_usd_per_gb", "download price"),
           ("inet_up_usd_per_gb", "upload price"))


def _prices_known(o) -> bool:
    # On every offer's path: Decimal.is_finite is several times cheaper than _known's float conversion.
    try:
        return (o.total_usd_per_hour.is_finite() and o.gpu_usd_per_hour.is_finite()
                and o.storage_usd_per_gb_month.is_finite() and o.inet_down_usd_per_gb.is_finite()
                and o.inet_up_usd_per_gb.is_finite())
    except AttributeError:  # None, or anything but a Decimal, where a price belongs
        return False


def _blank_price(value) -> bool:
    return not isinstance(value, Decimal) or not value.is_finite()


def _price_unknown_words(o, f, r) -> str:
    return " and ".join(words for name, words in _PRICES if _blank_price(getattr(o, name))) + " unknown"


def _in_ranges(ram: float, ranges) -> bool:
    for low, high in ranges:
        if low <= ram <= high:
            return True
    return False


def _driver_verdicts(needed: tuple[int, ...]):
    """A driver version's verdict, "ok", "old" or "unknown"; a catalogue has a handful of driver strings, so each is
    parsed once."""
    verdicts: dict = {}

    def verdict(text) -> str:
        try:
            return verdicts[text]
        except KeyError:
            version = parse_version(text) if isinstance(text, str) and text.strip() else None
            return verdicts.setdefault(
                text, "unknown" if version is None else "ok" if version_at_least(version, needed) else "old")
        except TypeError:  # unhashable junk where a string belongs
            return "unknown"
    return verdict


def _driver_unknown_words(o, f, r) -> str:
    text = o.driver_version
    return f"driver unknown ({text!r})" if isinstance(text, str) and text.strip() else "driver unknown"


def _max_gpus(f: OfferFilters, r: Recipe) -> int:
    """The most GPUs a box may have: the filters' cap, never below the recipe's own count (a cap of 1, the default,
    reads as "no GPU to spare" for a recipe on several); no cap when the filters set none."""
    return 1 << 30 if f.max_gpus is None else max(f.max_gpus, r.gpus)


def _vram_needed_words(o, f, r) -> str:
    if r.gpus == 1:
        return f"VRAM {_num(o.gpu_ram_gb)} GB < needed {_num(r.vram_gb)} GB for {r.model}"
    return (f"VRAM {r.gpus} x {_num(o.gpu_ram_gb)} GB = {_num(r.gpus * o.gpu_ram_gb)} GB < needed "
            f"{_num(r.vram_total_gb)} GB for {r.model} on {r.gpus} GPUs ({_num(r.vram_gb)} GB each)")


# In the order a user reads the reasons and `_tests` tests them; each filter's bit is its place here.
FILTERS = (
    Filter("rentable", _said("not rentable")),
    Filter("bids", _said("interruptible (bid) offer; bids not allowed")),
    Filter("gpus_unknown", _said("GPU count unknown")),
    Filter("gpus_needed",
           lambda o, f, r: f"{o.num_gpus} GPU{'s' if o.num_gpus != 1 else ''} < the {r.gpus} the recipe trains on"),
    Filter("gpu_count", lambda o, f, r: _gpus_text(o.num_gpus, f.min_gpus, f.max_gpus, r.gpus)),
    Filter("vram_unknown", _said("VRAM unknown")),
    Filter("vram_range", lambda o, f, r: f"VRAM {_num(o.gpu_ram_gb)} GB outside {_vram_range_text(f)}"),
    Filter("vram_needed", _vram_needed_words),
    Filter("price_unknown", _price_unknown_words),
    Filter("price_cap", lambda o, f, r: f"{usd(o.total_usd_per_hour)}/h > cap {usd(f.max_usd_per_hour)}"),
    Filter("driver_unknown", _driver_unknown_words),
    Filter("driver_old", lambda o, f, r: f"driver {o.driver_version.strip()} < needed {f.min_driver_version}"),
    Filter("cuda_unknown", _said("CUDA unknown")),
    Filter("cuda_old", lambda o, f, r: f"CUDA {_num(o.cuda_max)} < needed {_num(f.min_cuda)}"),
    Filter("disk_unknown", _said("disk unknown")),
    Filter("disk", lambda o, f, r: f"disk {_num(o.disk_gb)} GB < {_num(f.min_disk_gb)}"),
    Filter("downlink_unknown", _said("downlink unknown")),
    Filter("downlink", lambda o, f, r: f"downlink {_num(o.inet_down_mbps)} Mb/s < {_num(f.min_inet_down_mbps)}"),
    Filter("uplink_unknown", _said("uplink unknown")),
    Filter("uplink", lambda o, f, r: f"uplink {_num(o.inet_up_mbps)} Mb/s < {_num(f.min_inet_up_mbps)}"),
    Filter("location_unknown", _said("location unknown")),
    Filter("location",
           lambda o, f, r: f"location {country_code(o.geolocation)} not in {', '.join(sorted(f.locations))}"),
    Filter("reliability_unknown", _said("reliability unknown")),
    Filter("reliability", lambda o, f, r: f"reliability {o.reliability:.4g} < {f.min_reliability:g}"),
    Filter("verified", _said("not verified")),
)
BITS = {f.name: 1 << i for i, f in enumerate(FILTERS)}
# Set by the ranking after the filters, for offers it cannot price.
NO_THROUGHPUT = 1 << len(FILTERS)
UNBOUNDED_COST = NO_THROUGHPUT << 1
RANKING_BITS = NO_THROUGHPUT | UNBOUNDED_COST


def _no_throughput_words(o, f, r) -> str:
    return (f"no throughput figure: {o.gpu_name or 'unnamed GPU'} has no calibration and the listing has no TFLOPS or "
            f"DLPerf")


def _unbounded_cost_words(o, f, r) -> str:
    if not o.inet_down_mbps or o.inet_down_mbps <= 0:
        return "downlink 0 Mb/s: the model download never finishes"
    if not o.inet_up_mbps or o.inet_up_mbps <= 0:
        return "uplink 0 Mb/s: checkpoints never upload"
    return f"reliability {o.reliability:g}: the host is expected to be lost before any work is saved"


WORDS = {**{BITS[f.name]: f.words for f in FILTERS}, NO_THROUGHPUT: _no_throughput_words,
         UNBOUNDED_COST: _unbounded_cost_words}


def _tests(f: OfferFilters, r: Recipe, first: bool) -> Callable[[OfferRecord], int]:
    """Every filter's test, bound to one filters-and-recipe pair: for an offer, the bit of each filter it fails
    (in the order of FILTERS), or with `first` only the bit of the first one, stopping there; 0 when it passes.

    One function for all of them because the ranking runs it on every offer of the catalogue: a call per filter cost
    twice the tests themselves (and a generator's teardown as much again). A filter the settings turn off (no cap, a
    floor of 0, bids allowed) reads nothing of the offer. A field an offer leaves blank fails its "unknown" filter
    and skips the ones that compare it, so it reads "disk unknown", not "disk None GB < 250".
    """
    # Whether each filter applies, worked out once: a flag costs less to test than its condition.
    no_bids = not f.allow_bids
    gpus_needed = r.gpus if r.gpus > 1 else 0
    count_gpus, min_gpus, max_gpus = f.min_gpus > 1 or f.max_gpus is not None, f.min_gpus, _max_gpus(f, r)
    ranges, vram_needed = f.vram_ranges, r.vram_gb
    capped, cap = f.max_usd_per_hour is not None, f.max_usd_per_hour
    driver = _driver_verdicts(parse_version(f.min_driver_version)) if f.min_driver_version else None
    cuda_floor = round(f.min_cuda, 3)
    check_cuda = cuda_floor > 0
    min_disk, min_down, min_up, min_reliability = (f.min_disk_gb, f.min_inet_down_mbps, f.min_inet_up_mbps,
                                                   f.min_reliability)
    check_disk, check_down, check_up, check_reliability = min_disk > 0, min_down > 0, min_up > 0, min_reliability > 0
    by_location, countries, codes = bool(f.locations), f.allowed_countries, {}
    verified_only = f.require_verified

    def failed_filters(o: OfferRecord) -> int:
        failed = 0
        if not o.rentable:
            failed |= BITS["rentable"]
            if first:
                return failed
        if no_bids and o.is_bid:
            failed |= BITS["bids"]
            if first:
                return failed
        n = o.num_gpus
        if not n:
            failed |= BITS["gpus_unknown"]
            if first:
                return failed
        else:
            if gpus_needed and n < gpus_needed:
                failed |= BITS["gpus_needed"]
                if first:
                    return failed
            if count_gpus and not min_gpus <= n <= max_gpus:
                failed |= BITS["gpu_count"]
                if first:
                    return failed
        ram = o.gpu_ram_gb
        if not ram or not _known(ram):
            failed |= BITS["vram_unknown"]
            if first:
                return failed
        else:
            if ranges and not _in_ranges(ram, ranges):
                failed |= BITS["vram_range"]
                if first:
                    return failed
            if ram < vram_needed:
                failed |= BITS["vram_needed"]
                if first:
                    return failed
        if not _prices_known(o):
            failed |= BITS["price_unknown"]
            if first:
                return failed
        if capped and not _blank_price(o.total_usd_per_hour) and o.total_usd_per_hour > cap:
            failed |= BITS["price_cap"]
            if first:
                return failed
        if driver is not None:
            verdict = driver(o.driver_version)
            if verdict == "unknown":
                failed |= BITS["driver_unknown"]
                if first:
                    return failed
            elif verdict == "old":
                failed |= BITS["driver_old"]
                if first:
                    return failed
        if check_cuda:
            cuda = o.cuda_max
            if not cuda or not _known(cuda):
                failed |= BITS["cuda_unknown"]
                if first:
                    return failed
            elif round(cuda, 3) < cuda_floor:
                failed |= BITS["cuda_old"]
                if first:
                    return failed
        disk = o.disk_gb
        if not _known(disk):
            failed |= BITS["disk_unknown"]
            if first:
                return failed
        elif check_disk and disk < min_disk:
            failed |= BITS["disk"]
            if first:
                return failed
        down = o.inet_down_mbps
        if not _known(down):
            failed |= BITS["downlink_unknown"]
            if first:
                return failed
        elif check_down and down < min_down:
            failed |= BITS["downlink"]
            if first:
                return failed
        up = o.inet_up_mbps
        if not _known(up):
            failed |= BITS["uplink_unknown"]
            if first:
                return failed
        elif check_up and up < min_up:
            failed |= BITS["uplink"]
            if first:
                return failed
        if by_location:
            geo = o.geolocation
            code = codes[geo] if geo in codes else codes.setdefault(geo, country_code(geo))
            if not code:
                failed |= BITS["location_unknown"]
                if first:
                    return failed
            elif code not in countries:
                failed |= BITS["location"]
                if first:
                    return failed
        reliability = o.reliability
        if not _known(reliability):
            failed |= BITS["reliability_unknown"]
            if first:
                return failed
        elif check_reliability and reliability < min_reliability:
            failed |= BITS["reliability"]
            if first:
                return failed
        if verified_only and not o.verified:
            failed |= BITS["verified"]
            if first:
                return failed
        return failed
    return failed_filters


class CompiledFilters:
    """The filters bound to one filters-and-recipe pair.

    `first_failed(offer)` is the ranking's hot path: the bit of the first filter the offer fails, 0 when it passes,
    stopping there (most of 10,000 offers fail one of the first few). `mask(offer)` has a bit for every filter it
    fails, and `reasons(offer, mask)` turns them into the words a user reads.
    """

    def __init__(self, filters: OfferFilters, recipe: Recipe):
        self.filters = filters
        self.recipe = recipe
        self.first_failed: Callable[[OfferRecord], int] = _tests(filters, recipe, first=True)
        self.mask: Callable[[OfferRecord], int] = _tests(filters, recipe, first=False)

    def check(self, offer: OfferRecord) -> tuple[str, ...]:
        """Every reason the offer is excluded; () when it passes."""
        return self.reasons(offer, self.mask(offer))

    def reasons(self, o: OfferRecord, mask: int) -> tuple[str, ...]:
        words = []
        bit = 1
        while bit <= mask:
            if mask & bit:
                words.append(WORDS[bit](o, self.filters, self.recipe))
            bit <<= 1
        return tuple(words)


def compile_filters(filters: OfferFilters, recipe: Recipe) -> CompiledFilters:
    return CompiledFilters(filters, recipe)


def exclusion_reasons(offer: OfferRecord, filters: OfferFilters, recipe: Recipe | None = None) -> tuple[str, ...]:
    """Every reason the filters exclude one offer (() when it passes); for a page that looks one offer up."""
    return CompiledFilters(filters, recipe or Recipe()).check(offer)


def country_code(geolocation) -> str:
    """The two-letter code that ends vast.ai's geolocation ("US-CA, US" -> "US"); "" when there is none."""
    if not isinstance(geolocation, str) or not geolocation.strip():
        return ""
    return geolocation.rsplit(",", 1)[-1].strip().upper()


def usd(amount: Decimal) -> str:
    """$2.93, $1.30; more places only when they matter ($0.0125)."""
    if not amount.is_finite():
        return f"${amount}"
    cents = amount.quantize(Decimal("0.01"))
    if cents == amount:
        return f"${cents}"
    return "$" + f"{amount:.4f}".rstrip("0")


def _gpus_text(n, min_gpus, max_gpus, recipe_gpus=1) -> str:
    plural = "GPU" if n == 1 else "GPUs"
    if max_gpus is not None and max_gpus < recipe_gpus:
        return f"{n} {plural} > the recipe's {recipe_gpus} (max GPUs {max_gpus} reads as no GPU to spare)"
    if max_gpus == min_gpus:
        return f"{n} {plural}, need exactly {min_gpus}"
    if n < min_gpus:
        return f"{n} {plural} < min {min_gpus}"
    return f"{n} {plural} > max {max_gpus}"


def _vram_range_text(filters: OfferFilters) -> str:
    if filters.vram_min_gb is not None or filters.vram_max_gb is not None:
        low, high = filters.vram_min_gb, filters.vram_max_gb
        if high is None:
            return f"{_num(low)}+ GB"
        return f"{_num(low or 0)}-{_num(high)} GB"
    tiers = [GPU_TIERS[t] for t in filters.gpu_tiers]
    if len(tiers) == 1:
        label, low, high = tiers[0]
        return f"{_num(low)}-{_num(high)} GB ({label} tier)"
    return "the " + ", ".join(f"{label} ({_num(low)}-{_num(high)} GB)" for label, low, high in tiers) + " tiers"


def _num(value: float) -> str:
    return f"{value:g}"


def _tiers(value) -> tuple[str, ...]:
    if value is None or (isinstance(value, str) and value.strip().lower() in _ANY):
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"gpu_tiers must be a list of tier names or 'any', got {value!r}") from None
    tiers = []
    for item in items:
        key = str(item).strip().lower().replace(" ", "_").replace("-", "_")
        if key in _ANY:
            return ()
        key = _TIER_ALIASES.get(key, key)
        if key not in GPU_TIERS:
            raise ValueError(f"gpu_tiers: unknown tier {item!r} (known: {', '.join(GPU_TIERS)}, or 'any')")
        if key not in tiers:
            tiers.append(key)
    return tuple(tiers)


def _locations(value) -> frozenset[str]:
    if value is None or (isinstance(value, str) and value.strip().lower() in _ANY):
        return frozenset()
    if isinstance(value, str):
        value = value.split(",")
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"locations must be a list of country codes or regions, got {value!r}") from None
    result = set()
    for item in items:
        code = str(item).strip().upper()
        if code.lower() in _ANY:
            return frozenset()
        if code in REGIONS or (len(code) == 2 and code.isalpha()):
            result.add(code)
        else:
            raise ValueError(
                f"locations: {item!r} is neither a two-letter country code nor a region ({', '.join(REGIONS)})")
    return frozenset(result)


def _number(name, value) -> float:
    return number(name, value, non_negative=True)


def _optional_number(name, value) -> float | None:
    return None if value is None or value == "" else _number(name, value)


def _optional_money(name, value) -> Decimal | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an amount in dollars like '1.30', got {value!r}")
    if isinstance(value, float):  # accepted from JSON forms, through its shortest text, never its binary value
        value = repr(value)
    try:
        amount = Decimal(str(value).strip().lstrip("$"))
    except InvalidOperation:
        raise ValueError(f"{name} must be an amount in dollars like '1.30', got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{name} must be an amount >= 0, got {value!r}")
    return amount


def _flag(name, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off", ""):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _count(name, value) -> int:
    try:
        count = whole(name, value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return count
