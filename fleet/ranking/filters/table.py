"""FILTERS: every hard filter as one entry, in the order a user reads the reasons, with its test and its words.

An excluded offer gets every reason that applies. A field an offer leaves blank, NaN or infinite fails its
"... unknown" filter, and the filters that compare that field skip it (`given`).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from fleet.providers.records import OfferRecord

from .. import memory
from ..price import per_hour, rental_usd_per_hour
from ..workload import Workload
from .settings import GPU_TIERS, OfferFilters, parse_version, version_at_least

Words = Callable[[OfferRecord, OfferFilters, Workload], str]


def _always(f: OfferFilters, r: Workload) -> bool:
    return True


def _nothing(f: OfferFilters, r: Workload) -> dict:
    return {}


@dataclass(frozen=True)
class Filter:
    """One hard filter. `test` is a Python expression, true when offer `o` fails; it reads the names `binds` makes
    from the settings, a `reads` line of an entry it is `given`, and TEST_NAMES. compiled.py joins the tests into
    one function."""

    name: str  # its bit is its place in FILTERS
    heading: str  # the Offers page's group of the offers it excludes first
    test: str
    words: Words  # the reason a user reads
    when: Callable[[OfferFilters, Workload], bool] = _always  # off, it reads nothing of the offer
    binds: Callable[[OfferFilters, Workload], dict] = _nothing  # worked out once per ranking
    reads: str = ""  # "name = o.field", read once for this test and the entries given it
    given: str = ""  # the "... unknown" entry above: this one runs only where that one passes


def _said(text: str) -> Words:
    return lambda o, f, r: text


# The prices the cost model reads, with the words a user reads when one is blank; the total comes first.
_PRICES = (("total_usd_per_hour", "price"), ("gpu_usd_per_hour", "GPU price"),
           ("storage_usd_per_gb_month", "storage price"), ("inet_down_usd_per_gb", "download price"),
           ("inet_up_usd_per_gb", "upload price"))


def _price_unknown_words(o, f, r) -> str:
    return " and ".join(words for name, words in _PRICES if _blank_price(getattr(o, name))) + " unknown"


def _price_cap_words(o, f, r) -> str:
    # The price the offer's row shows, as it shows it: the rental with the disk the ranking rents.
    return f"{per_hour(rental_usd_per_hour(o, int(r.rent_disk_gb)))} > cap {usd(f.max_usd_per_hour)}/h"


def _mem_bw_words(o, f, r) -> str:
    if not _known(o.gpu_mem_bw_gb_s):
        return "GPU memory bandwidth unknown"
    return f"GPU memory {_num(o.gpu_mem_bw_gb_s)} GB/s < {_num(f.min_gpu_mem_bw_gb_s)}"


def _driver_unknown_words(o, f, r) -> str:
    text = o.driver_version
    return f"driver unknown ({text!r})" if isinstance(text, str) and text.strip() else "driver unknown"


def _host_short(card_gb, host_gb, needs):
    """(host memory needed, plan) where a card of `card_gb` takes a plan with the moments on the host and the
    listing's host memory is short of it; None otherwise (a listing silent on it passes)."""
    if host_gb is None or not _known(host_gb):
        return None
    for low, high, need, plan in needs:
        if low <= card_gb < high and host_gb < need:
            return need, plan
    return None


def _host_ram_words(o, f, r) -> str:
    need, plan = _host_short(o.gpu_ram_gb, o.cpu_ram_gb, memory.host_needs(r))
    return f"host memory {_num(o.cpu_ram_gb)} GB < needed {_num(round(need, 1))} GB for {r.model} ({plan})"


def _vram_needed_words(o, f, r) -> str:
    if r.gpus == 1:
        return f"VRAM {_num(o.gpu_ram_gb)} GB < needed {_num(r.vram_gb)} GB for {r.model}"
    return (f"VRAM {r.gpus} x {_num(o.gpu_ram_gb)} GB = {_num(r.gpus * o.gpu_ram_gb)} GB < needed "
            f"{_num(r.vram_total_gb)} GB for {r.model} on {r.gpus} GPUs ({_num(r.vram_gb)} GB each)")


def _max_gpus(f: OfferFilters, r: Workload) -> int:
    """The most GPUs a box may have: the filters' cap, never below the recipe's own count (a cap of 1, the default,
    reads as "no GPU to spare" for a recipe on several); no cap when the filters set none."""
    return 1 << 30 if f.max_gpus is None else max(f.max_gpus, r.gpus)


def _at_least(name: str, heading: str, field: str, setting: str, unit: str) -> tuple[Filter, Filter]:
    """An offer figure a setting asks a minimum of: "NAME unknown" where the offer leaves it blank, then the floor
    (off at 0), said as "NAME 100 UNIT < 250"."""
    return (Filter(f"{name}_unknown", f"{name} unknown", reads=f"{name} = o.{field}",
                   test=f"not known({name})", words=_said(f"{name} unknown")),
            Filter(name, heading, given=f"{name}_unknown", when=lambda f, r: getattr(f, setting) > 0,
                   binds=lambda f, r: {f"min_{name}": getattr(f, setting)},
                   test=f"{name} < min_{name}",
                   words=lambda o, f, r: f"{name} {_num(getattr(o, field))} {unit} < {_num(getattr(f, setting))}"))


FILTERS: tuple[Filter, ...] = (
    Filter("rentable", "not rentable",
           test="not o.rentable", words=_said("not rentable")),
    # Interruptible boxes get reclaimed mid-phase, so bids are opt-in.
    Filter("bids", "interruptible (bid), and bids are not allowed", when=lambda f, r: not f.allow_bids,
           test="o.is_bid", words=_said("interruptible (bid) offer; bids not allowed")),
    Filter("gpus_unknown", "GPU count unknown", reads="n = o.num_gpus",
           test="not n", words=_said("GPU count unknown")),
    Filter("gpus_needed", "fewer GPUs than the recipe trains on", given="gpus_unknown", when=lambda f, r: r.gpus > 1,
           binds=lambda f, r: {"gpus_needed": r.gpus},
           test="n < gpus_needed",
           words=lambda o, f, r: f"{o.num_gpus} GPU{'s' if o.num_gpus != 1 else ''} < the {r.gpus} the recipe "
                                 f"trains on"),
    Filter("gpu_count", "GPU count outside the range", given="gpus_unknown",
           when=lambda f, r: f.min_gpus > 1 or f.max_gpus is not None,
           binds=lambda f, r: {"min_gpus": f.min_gpus, "max_gpus": _max_gpus(f, r)},
           test="not min_gpus <= n <= max_gpus",
           words=lambda o, f, r: _gpus_text(o.num_gpus, f.min_gpus, f.max_gpus, r.gpus)),
    # GPU names vary ("H200" vs "H200 NVL"), so tiers are memory ranges.
    Filter("vram_unknown", "VRAM unknown", reads="ram = o.gpu_ram_gb",
           test="not ram or not known(ram)", words=_said("VRAM unknown")),
    Filter("vram_range", "VRAM outside the GPU tiers", given="vram_unknown", when=lambda f, r: bool(f.vram_ranges),
           binds=lambda f, r: {"ranges": f.vram_ranges},
           test="not in_ranges(ram, ranges)",
           words=lambda o, f, r: f"VRAM {_num(o.gpu_ram_gb)} GB outside {_vram_range_text(f)}"),
    Filter("vram_needed", "too little VRAM for the model", given="vram_unknown",
           binds=lambda f, r: {"vram_needed": r.vram_gb},
           test="ram < vram_needed", words=_vram_needed_words),
    # Where the only plan that fits the card keeps the moments on the host, the host must hold them (pinned).
    Filter("host_ram_needed", "too little host memory for the moments on the host", given="vram_unknown",
           when=lambda f, r: bool(memory.host_needs(r)), binds=lambda f, r: {"host_needs": memory.host_needs(r)},
           test="host_short(ram, o.cpu_ram_gb, host_needs) is not None", words=_host_ram_words),
    Filter("price_unknown", "price unknown",
           test="not prices_known(o)", words=_price_unknown_words),
    # Stops "cheapest rentable" from landing on $1.90-2.50/h boxes. The cap is on the rental's price (the machine
    # or the bid, and the disk rented), the $/h a person reads in the offer's row.
    Filter("price_cap", "above the price cap", given="price_unknown", when=lambda f, r: f.max_usd_per_hour is not None,
           binds=lambda f, r: {"cap": f.max_usd_per_hour, "rented_disk_gb": int(r.rent_disk_gb)},
           test="rental_usd_per_hour(o, rented_disk_gb) > cap",
           words=_price_cap_words),
    # A driver older than the image's CUDA rents fine and then dies with CUDA error 803.
    Filter("driver_unknown", "driver unknown", when=lambda f, r: bool(f.min_driver_version),
           binds=lambda f, r: {"driver": _driver_verdicts(f.min_driver_version)},
           reads="verdict = driver(o.driver_version)",
           test='verdict == "unknown"', words=_driver_unknown_words),
    Filter("driver_old", "driver older than needed", given="driver_unknown",
           test='verdict == "old"',
           words=lambda o, f, r: f"driver {o.driver_version.strip()} < needed {f.min_driver_version}"),
    Filter("cuda_unknown", "CUDA unknown", when=lambda f, r: round(f.min_cuda, 3) > 0, reads="cuda = o.cuda_max",
           test="not cuda or not known(cuda)", words=_said("CUDA unknown")),
    Filter("cuda_old", "CUDA older than needed", given="cuda_unknown",
           binds=lambda f, r: {"cuda_floor": round(f.min_cuda, 3)},
           test="round(cuda, 3) < cuda_floor",
           words=lambda o, f, r: f"CUDA {_num(o.cuda_max)} < needed {_num(f.min_cuda)}"),
    # 250 GB holds the 67 GB base plus a merged and an FP8 copy.
    *_at_least("disk", "too little disk", "disk_gb", "min_disk_gb", "GB"),
    # A slow link turns every 7 GB checkpoint into idle GPU hours.
    *_at_least("downlink", "downlink too slow", "inet_down_mbps", "min_inet_down_mbps", "Mb/s"),
    *_at_least("uplink", "uplink too slow", "inet_up_mbps", "min_inet_up_mbps", "Mb/s"),
    # Advertised bandwidth is local, so hosts must sit near the checkpoint bucket.
    Filter("location_unknown", "location unknown", when=lambda f, r: bool(f.locations or f.excluded_locations),
           binds=lambda f, r: {"codes": _CountryCodes()}, reads="code = codes[o.geolocation]",
           test="not code", words=_said("location unknown")),
    Filter("location", "outside the locations", given="location_unknown", when=lambda f, r: bool(f.locations),
           binds=lambda f, r: {"countries": f.allowed_countries},
           test="code not in countries",
           words=lambda o, f, r: f"location {country_code(o.geolocation)} not in {', '.join(sorted(f.locations))}"),
    # The same country codes as vast.ai's geolocation notin.
    Filter("location_excluded", "in an excluded location", given="location_unknown",
           when=lambda f, r: bool(f.excluded_locations), binds=lambda f, r: {"kept_out": f.excluded_countries},
           test="code in kept_out",
           words=lambda o, f, r: f"location {country_code(o.geolocation)} is excluded "
                                 f"({', '.join(sorted(f.excluded_locations))})"),
    # A 0.99 floor empties the cheap tier, so the floor is 0.95 and the cost model prices the rest.
    Filter("reliability_unknown", "reliability unknown", reads="reliability = o.reliability",
           test="not known(reliability)", words=_said("reliability unknown")),
    Filter("reliability", "reliability too low", given="reliability_unknown", when=lambda f, r: f.min_reliability > 0,
           binds=lambda f, r: {"min_reliability": f.min_reliability},
           test="reliability < min_reliability",
           words=lambda o, f, r: f"reliability {o.reliability:.4g} < {f.min_reliability:g}"),
    Filter("verified", "host not verified", when=lambda f, r: f.require_verified,
           test="not o.verified", words=_said("not verified")),
    # A training box's throughput: a datacenter host (vast.ai's datacenter=true) and fast GPU memory (gpu_mem_bw).
    Filter("datacenter", "not a datacenter host", when=lambda f, r: f.datacenter_only,
           test="o.datacenter is not True",
           words=lambda o, f, r: "not a datacenter host" if o.datacenter is False else "hosting type unknown"),
    Filter("gpu_mem_bw", "GPU memory too slow", when=lambda f, r: f.min_gpu_mem_bw_gb_s > 0,
           binds=lambda f, r: {"min_mem_bw": f.min_gpu_mem_bw_gb_s}, reads="mem_bw = o.gpu_mem_bw_gb_s",
           test="not known(mem_bw) or mem_bw < min_mem_bw", words=_mem_bw_words),
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


WORDS: dict[int, Words] = {**{BITS[f.name]: f.words for f in FILTERS}, NO_THROUGHPUT: _no_throughput_words,
                           UNBOUNDED_COST: _unbounded_cost_words}


def _known(value) -> bool:
    """A usable number: not None, NaN or an infinity (a float or a Decimal), and a number at all."""
    try:
        return math.isfinite(value)
    except (TypeError, ValueError):  # None, no number at all, or a signalling NaN
        return False


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


def _in_ranges(ram: float, ranges) -> bool:
    for low, high in ranges:
        if low <= ram <= high:
            return True
    return False


def _driver_verdicts(min_version: str):
    """A driver version's verdict, "ok", "old" or "unknown"; a catalogue has a handful of driver strings, so each is
    parsed once."""
    needed = parse_version(min_version)
    assert needed is not None  # OfferFilters refuses a floor that is not dotted numbers
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


class _CountryCodes(dict):
    """A geolocation's country code, each place worked out once."""

    def __missing__(self, geolocation):
        code = self[geolocation] = country_code(geolocation)
        return code


# What a test may call besides the names its entry binds.
TEST_NAMES = {"known": _known, "prices_known": _prices_known, "blank_price": _blank_price, "in_ranges": _in_ranges,
              "rental_usd_per_hour": rental_usd_per_hour, "host_short": _host_short}


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
            return f"{_num(low or 0)}+ GB"
        return f"{_num(low or 0)}-{_num(high)} GB"
    tiers = [GPU_TIERS[t] for t in filters.gpu_tiers]
    if len(tiers) == 1:
        label, low, high = tiers[0]
        return f"{_num(low)}-{_num(high)} GB ({label} tier)"
    return "the " + ", ".join(f"{label} ({_num(low)}-{_num(high)} GB)" for label, low, high in tiers) + " tiers"


def _num(value: float) -> str:
    return f"{value:g}"
