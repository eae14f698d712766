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
    """One hard filter, written once: whether the filters turn it on, its test bound to their thresholds (true when
    the offer fails it), and the words a user reads. A field an offer leaves blank fails its "unknown" filter and
    passes the ones that compare it, so it reads "disk unknown", not "disk None GB < 250"."""

    name: str
    applies: Callable[[OfferFilters, Recipe], bool]
    bind: Callable[[OfferFilters, Recipe], Callable[[OfferRecord], bool]]
    words: Callable[[OfferRecord, OfferFilters, Recipe], str]


def _always(f: OfferFilters, r: Recipe) -> bool:
    return True


def _said(text: str):
    return lambda o, f, r: text


def _blank(value) -> bool:
    """None, NaN or an infinity (a float or a Decimal): either way the listing did not say a usable number."""
    if value is None:
        return True
    try:
        return not math.isfinite(value)
    except (TypeError, ValueError):  # a signalling NaN, or no number at all
        return True


# The prices the cost model reads, with the words a user reads when one is blank; the total comes first.
_PRICES = (("total_usd_per_hour", "price"), ("gpu_usd_per_hour", "GPU price"),
           ("storage_usd_per_gb_month", "storage price"), ("inet_down_usd_per_gb", "download price"),
           ("inet_up_usd_per_gb", "upload price"))


def _price_unknown(o) -> bool:
    # On every offer's path: Decimal.is_finite is several times cheaper than _blank's float conversion.
    try:
        return not (o.total_usd_per_hour.is_finite() and o.gpu_usd_per_hour.is_finite()
                    and o.storage_usd_per_gb_month.is_finite() and o.inet_down_usd_per_gb.is_finite()
                    and o.inet_up_usd_per_gb.is_finite())
    except AttributeError:  # None, or anything but a Decimal, where a price belongs
        return True


def _blank_price(value) -> bool:
    return not isinstance(value, Decimal) or not value.is_finite()


def _price_unknown_words(o, f, r) -> str:
    return " and ".join(words for name, words in _PRICES if _blank_price(getattr(o, name))) + " unknown"


def _in_ranges(ram: float, ranges) -> bool:
    return any(low <= ram <= high for low, high in ranges)


def _driver_bind(f: OfferFilters, r: Recipe):
    needed = parse_version(f.min_driver_version)
    verdicts: dict = {}  # a catalogue has a handful of driver strings: each is parsed once

    def verdict(text) -> str:
        version = parse_version(text) if isinstance(text, str) and text.strip() else None
        return "unknown" if version is None else "ok" if version_at_least(version, needed) else "old"

    def check(o, want):
        text = o.driver_version
        try:
            return verdicts[text] == want
        except KeyError:
            return verdicts.setdefault(text, verdict(text)) == want
        except TypeError:  # unhashable junk where a string belongs
            return want == "unknown"
    return check


def _location_bind(f: OfferFilters, r: Recipe):
    countries, codes = f.allowed_countries, {}

    def check(o, want):
        geo = o.geolocation
        code = codes[geo] if geo in codes else codes.setdefault(geo, country_code(geo))
        return (not code) if want == "unknown" else bool(code) and code not in countries
    return check


def _driver_unknown_words(o, f, r) -> str:
    text = o.driver_version
    return f"driver unknown ({text!r})" if isinstance(text, str) and text.strip() else "driver unknown"


def _has_driver_floor(f: OfferFilters, r: Recipe) -> bool:
    return bool(f.min_driver_version)


def _has_cuda_floor(f: OfferFilters, r: Recipe) -> bool:
    return round(f.min_cuda, 3) > 0


def _max_gpus(f: OfferFilters, r: Recipe) -> int:
    """The most GPUs a box may have: the filters' cap, never below the recipe's own count (a cap of 1, the default,
    reads as "no GPU to spare" for a recipe on several); no cap when the filters set none."""
    return 1 << 30 if f.max_gpus is None else max(f.max_gpus, r.gpus)


def _vram_needed_words(o, f, r) -> str:
    if r.gpus == 1:
        return f"VRAM {_num(o.gpu_ram_gb)} GB < needed {_num(r.vram_gb)} GB for {r.model}"
    return (f"VRAM {r.gpus} x {_num(o.gpu_ram_gb)} GB = {_num(r.gpus * o.gpu_ram_gb)} GB < needed "
            f"{_num(r.vram_total_gb)} GB for {r.model} on {r.gpus} GPUs ({_num(r.vram_gb)} GB each)")


# In the order a user reads the reasons; each filter's bit is its place here. A filter applies only where it can
# exclude something (a floor of 0 cannot), so an offer that passes costs only the tests that could have failed it.
FILTERS = (
    Filter("rentable", _always, lambda f, r: lambda o: not o.rentable, _said("not rentable")),
    Filter("bids", lambda f, r: not f.allow_bids, lambda f, r: lambda o: bool(o.is_bid),
           _said("interruptible (bid) offer; bids not allowed")),
    Filter("gpus_unknown", _always, lambda f, r: lambda o: not o.num_gpus, _said("GPU count unknown")),
    Filter("gpus_needed", lambda f, r: r.gpus > 1,
           lambda f, r: (lambda needed: lambda o: bool(o.num_gpus) and o.num_gpus < needed)(r.gpus),
           lambda o, f, r: f"{o.num_gpus} GPU{'s' if o.num_gpus != 1 else ''} < the {r.gpus} the recipe trains on"),
    Filter("gpu_count", lambda f, r: f.min_gpus > 1 or f.max_gpus is not None,
           lambda f, r: (lambda low, high: lambda o: bool(o.num_gpus) and not low <= o.num_gpus <= high)(
               f.min_gpus, _max_gpus(f, r)),
           lambda o, f, r: _gpus_text(o.num_gpus, f.min_gpus, f.max_gpus, r.gpus)),
    Filter("vram_unknown", _always, lambda f, r: lambda o: not o.gpu_ram_gb or _blank(o.gpu_ram_gb),
           _said("VRAM unknown")),
    Filter("vram_range", lambda f, r: bool(f.vram_ranges),
           lambda f, r: (lambda ranges: lambda o: bool(o.gpu_ram_gb) and not _blank(o.gpu_ram_gb)
                         and not _in_ranges(o.gpu_ram_gb, ranges))(f.vram_ranges),
           lambda o, f, r: f"VRAM {_num(o.gpu_ram_gb)} GB outside {_vram_range_text(f)}"),
    Filter("vram_needed", _always,
           lambda f, r: (lambda needed: lambda o: bool(o.gpu_ram_gb) and not _blank(o.gpu_ram_gb)
                         and o.gpu_ram_gb < needed)(r.vram_gb),
           _vram_needed_words),
    Filter("price_unknown", _always, lambda f, r: _price_unknown, _price_unknown_words),
    Filter("price_cap", lambda f, r: f.max_usd_per_hour is not None,
           lambda f, r: (lambda cap: lambda o: not _blank_price(o.total_usd_per_hour) and o.total_usd_per_hour > cap)(
               f.max_usd_per_hour),
           lambda o, f, r: f"{usd(o.total_usd_per_hour)}/h > cap {usd(f.max_usd_per_hour)}"),
    Filter("driver_unknown", _has_driver_floor,
           lambda f, r: (lambda check: lambda o: check(o, "unknown"))(_driver_bind(f, r)), _driver_unknown_words),
    Filter("driver_old", _has_driver_floor, lambda f, r: (lambda check: lambda o: check(o, "old"))(_driver_bind(f, r)),
           lambda o, f, r: f"driver {o.driver_version.strip()} < needed {f.min_driver_version}"),
    Filter("cuda_unknown", _has_cuda_floor, lambda f, r: lambda o: not o.cuda_max or _blank(o.cuda_max),
           _said("CUDA unknown")),
    Filter("cuda_old", _has_cuda_floor,
           lambda f, r: (lambda floor: lambda o: bool(o.cuda_max) and not _blank(o.cuda_max)
                         and round(o.cuda_max, 3) < floor)(round(f.min_cuda, 3)),
           lambda o, f, r: f"CUDA {_num(o.cuda_max)} < needed {_num(f.min_cuda)}"),
    Filter("disk_unknown", _always, lambda f, r: lambda o: _blank(o.disk_gb), _said("disk unknown")),
    Filter("disk", lambda f, r: f.min_disk_gb > 0,
           lambda f, r: (lambda low: lambda o: not _blank(o.disk_gb) and o.disk_gb < low)(f.min_disk_gb),
           lambda o, f, r: f"disk {_num(o.disk_gb)} GB < {_num(f.min_disk_gb)}"),
    Filter("downlink_unknown", _always, lambda f, r: lambda o: _blank(o.inet_down_mbps), _said("downlink unknown")),
    Filter("downlink", lambda f, r: f.min_inet_down_mbps > 0,
           lambda f, r: (lambda low: lambda o: not _blank(o.inet_down_mbps) and o.inet_down_mbps < low)(
               f.min_inet_down_mbps),
           lambda o, f, r: f"downlink {_num(o.inet_down_mbps)} Mb/s < {_num(f.min_inet_down_mbps)}"),
    Filter("uplink_unknown", _always, lambda f, r: lambda o: _blank(o.inet_up_mbps), _said("uplink unknown")),
    Filter("uplink", lambda f, r: f.min_inet_up_mbps > 0,
           lambda f, r: (lambda low: lambda o: not _blank(o.inet_up_mbps) and o.inet_up_mbps < low)(
               f.min_inet_up_mbps),
           lambda o, f, r: f"uplink {_num(o.inet_up_mbps)} Mb/s < {_num(f.min_inet_up_mbps)}"),
    Filter("location_unknown", lambda f, r: bool(f.locations),
           lambda f, r: (lambda check: lambda o: check(o, "unknown"))(_location_bind(f, r)),
           _said("location unknown")),
    Filter("location", lambda f, r: bool(f.locations),
           lambda f, r: (lambda check: lambda o: check(o, "outside"))(_location_bind(f, r)),
           lambda o, f, r: f"location {country_code(o.geolocation)} not in {', '.join(sorted(f.locations))}"),
    Filter("reliability_unknown", _always, lambda f, r: lambda o: _blank(o.reliability),
           _said("reliability unknown")),
    Filter("reliability", lambda f, r: f.min_reliability > 0,
           lambda f, r: (lambda low: lambda o: not _blank(o.reliability) and o.reliability < low)(f.min_reliability),
           lambda o, f, r: f"reliability {o.reliability:.4g} < {f.min_reliability:g}"),
    Filter("verified", lambda f, r: f.require_verified, lambda f, r: lambda o: not o.verified, _said("not verified")),
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


class CompiledFilters:
    """The filter table bound to one filters-and-recipe pair: the filters that apply, each test with its
    thresholds bound once.

    `first_failed(offer)` is the ranking's hot path: the bit of the first filter the offer fails, 0 when it passes,
    stopping there (most of 10,000 offers fail one of the first few). `mask(offer)` has a bit for every filter it
    fails, and `reasons(offer, mask)` turns them into the words a user reads.
    """

    def __init__(self, filters: OfferFilters, recipe: Recipe):
        self.filters = filters
        self.recipe = recipe
        self.tests = tuple((BITS[f.name], f.bind(filters, recipe)) for f in FILTERS if f.applies(filters, recipe))

    def first_failed(self, offer: OfferRecord) -> int:
        for bit, fails in self.tests:
            if fails(offer):
                return bit
        return 0

    def mask(self, offer: OfferRecord) -> int:
        m = 0
        for bit, fails in self.tests:
            if fails(offer):
                m |= bit
        return m

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
