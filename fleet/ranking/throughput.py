"""How fast the recipe runs on an offer's GPU: measured where we can, estimated (and marked so) where we cannot
(docs/fleet.md, "fleet/ranking/throughput.py")."""

import math
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from fleet.providers.records import OfferRecord

from .workload import KERNEL_PATHS, Workload, resolve_kernel_path

FLOPS_PER_ACTIVE_PARAM_PER_TOKEN = 6.0
SEED_WEIGHT = 2.0
MAX_WEIGHT = 20.0
MULTI_GPU_EFFICIENCY = 0.85  # data parallel in one box loses some to gradient sync; until runs calibrate it
# A recipe on several GPUs sends every routed token to the rank holding its expert and back (all-to-all), each layer,
# forward and backward: for 30B-A3B about 6 MB a token, 30 GB/s a GPU at 10,000 tokens/s on 2 GPUs. NVLink (600-1,800
# GB/s) carries that beside the compute; PCIe (25-50 GB/s, about 20 achieved) does not, so a box whose listing says
# its GPUs have no NVLink is taken at this share of the speed, until runs on such boxes calibrate it.
PCIE_ALL_TO_ALL_FACTOR = 0.5
ESTIMATE_DISCOUNT = 0.8  # an unmeasured card must beat a measured one by more than its spec-sheet promise
# Listed TFLOPS -> achieved model TFLOP/s when no calibrated offer in the catalogue anchors the ratio; taken from a
# dense-BF16 listing (H200 ~990 listed, ~41 achieved), so it errs low if a listing uses another precision.
DEFAULT_LISTED_TO_MODEL_TFLOPS = 0.04

_new_throughput = tuple.__new__  # skips NamedTuple's keyword handling on the hot path


@dataclass(frozen=True, slots=True)
class CalibrationEntry:
    gpu_model: str  # canonical, see gpu_model_key
    kernel_path: str  # "grouped_mm" or "triton"
    model_tflops: float  # per GPU
    weight: float  # how many runs' worth of evidence the mean holds (seeds count SEED_WEIGHT), capped
    measured_runs: int  # finished runs folded in; 0 = seed figure only
    note: str = ""


@dataclass(frozen=True)
class Calibration:
    entries: dict[tuple[str, str], CalibrationEntry]

    def get(self, gpu_model: str, kernel_path: str) -> CalibrationEntry | None:
        return self.entries.get((gpu_model_key(gpu_model), kernel_path))

    def best_model_tflops(self) -> float:
        return max((e.model_tflops for e in self.entries.values()), default=0.0)

    def to_dict(self) -> dict:
        return {
            "entries": [
                {
                    "gpu_model": e.gpu_model,
                    "kernel_path": e.kernel_path,
                    "model_tflops": e.model_tflops,
                    "weight": e.weight,
                    "measured_runs": e.measured_runs,
                    "note": e.note,
                }
                for e in sorted(self.entries.values(), key=lambda e: (e.gpu_model, e.kernel_path))
            ]
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        entries = {}
        for item in data.get("entries", []):
            try:
                entry = CalibrationEntry(
                    gpu_model=gpu_model_key(str(item["gpu_model"])),
                    kernel_path=str(item["kernel_path"]),
                    model_tflops=float(item["model_tflops"]),
                    weight=float(item.get("weight", SEED_WEIGHT)),
                    measured_runs=int(item.get("measured_runs", 0)),
                    note=str(item.get("note", "")),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"bad calibration entry {item!r}: {exc}") from None
            if entry.kernel_path not in KERNEL_PATHS or entry.kernel_path == "auto":
                raise ValueError(f"bad calibration entry {item!r}: kernel_path must be grouped_mm or triton")
            if not (entry.model_tflops > 0 and math.isfinite(entry.model_tflops)) or not entry.weight > 0:
                raise ValueError(f"bad calibration entry {item!r}: model_tflops and weight must be > 0")
            entries[(entry.gpu_model, entry.kernel_path)] = entry
        return cls(entries)


def gpu_model_key(name: str) -> str:
    """"NVIDIA H200 NVL" -> "H200 NVL"; "RTX PRO 6000 WS" stays itself (lookup falls back to its family)."""
    words = name.upper().replace("_", " ").split()
    return " ".join(w for w in words if w not in ("NVIDIA", "GEFORCE"))


def tokens_per_s(model_tflops: float, recipe: Workload) -> float:
    return model_tflops * 1e12 / (FLOPS_PER_ACTIVE_PARAM_PER_TOKEN * recipe.active_params_b * 1e9)


def model_tflops_of(tokens_per_second: float, recipe: Workload) -> float:
    return tokens_per_second * FLOPS_PER_ACTIVE_PARAM_PER_TOKEN * recipe.active_params_b * 1e9 / 1e12


def _seed(gpu: str, path: str, step_s: float, tokens_per_step: int, active_b: float, note: str) -> CalibrationEntry:
    tflops = tokens_per_step / step_s * FLOPS_PER_ACTIVE_PARAM_PER_TOKEN * active_b / 1e3
    return CalibrationEntry(gpu, path, tflops, SEED_WEIGHT, 0, note)


# Seed figures from the field notes' SFT recipe on Qwen3.6-35B-A3B (3B active; batch 2 x 16 accumulation x 2048
# tokens = 65,536 tokens a step). H200 has no SFT figure of its own: its continued-pretraining step time matched the
# B200's within noise, so it takes the B200's. The RTX PRO 6000 Triton figure (57 s) ran without the routed-expert
# LoRA math (the import bug), so it is seeded 10% slower until a run measures it.
SEED_CALIBRATION = Calibration(
    {
        (e.gpu_model, e.kernel_path): e
        for e in (
            _seed("B200", "grouped_mm", 28.5, 65536, 3.0, "seed: SFT 28.5 s/step"),
            _seed("H200", "grouped_mm", 28.5, 65536, 3.0, "seed: matched B200 within noise"),
            _seed("RTX PRO 6000", "triton", 57.0 / 0.9, 65536, 3.0, "seed: SFT 57 s/step, +10% for routed LoRA"),
            _seed("RTX PRO 6000", "grouped_mm", 112.0, 65536, 3.0, "seed: SFT 112 s/step on the sm_120 fallback"),
        )
    }
)


def record_step_time(
    calibration: Calibration,
    *,
    gpu_name: str,
    kernel_path: str,
    recipe: Workload,
    step_seconds: float,
    num_gpus: int = 1,
) -> Calibration:
    """A new Calibration with one finished run's steady-state step time folded into its (GPU model, kernel path).

    One run is one observation however many steps it ran, so a single long run cannot drown the others.
    """
    if kernel_path not in ("grouped_mm", "triton"):
        raise ValueError(f"kernel_path must be the path the run used (grouped_mm or triton), got {kernel_path!r}")
    if not (isinstance(step_seconds, (int, float)) and math.isfinite(step_seconds) and step_seconds > 0):
        raise ValueError(f"step_seconds must be a positive number, got {step_seconds!r}")
    if not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus must be a whole number >= 1, got {num_gpus!r}")
    gpu = gpu_model_key(gpu_name)
    if not gpu:
        raise ValueError("gpu_name is blank")
    per_gpu_tokens_per_s = recipe.tokens_per_step / step_seconds / _gpu_scale(num_gpus)
    observed = model_tflops_of(per_gpu_tokens_per_s, recipe)

    entries = dict(calibration.entries)
    old = entries.get((gpu, kernel_path))
    if old is None:
        new = CalibrationEntry(gpu, kernel_path, observed, 1.0, 1, "measured")
    else:
        weight = min(old.weight, MAX_WEIGHT)
        mean = old.model_tflops + (observed - old.model_tflops) / (weight + 1.0)
        new = replace(old, model_tflops=mean, weight=min(weight + 1.0, MAX_WEIGHT), measured_runs=old.measured_runs + 1)
    entries[(gpu, kernel_path)] = new
    return Calibration(entries)


class Throughput(NamedTuple):
    tokens_per_s: float  # the whole offer (all its GPUs)
    kernel_path: str
    estimated: bool
    source: str  # "calibrated H200/grouped_mm (3 runs)", "estimate from 60 listed TFLOPS", ...


def over_pcie(offer: OfferRecord) -> bool:
    """The listing says the box's GPUs have no NVLink between them (0 GB/s); not when it says nothing."""
    return offer.nvlink_gb_s == 0


def interconnect(offer: OfferRecord) -> str:
    """How the box's GPUs talk to each other, as its listing says: "NVLink 900 GB/s", "PCIe 50.4 GB/s", "PCIe"
    (no NVLink, no PCIe figure), "unlisted"; "" for a box of one GPU."""
    if not isinstance(offer.num_gpus, int) or offer.num_gpus < 2:
        return ""
    if over_pcie(offer):
        return f"PCIe {offer.pcie_gb_s:g} GB/s" if offer.pcie_gb_s else "PCIe"
    return f"NVLink {offer.nvlink_gb_s:g} GB/s" if offer.nvlink_gb_s else "unlisted"


class ThroughputModel:
    """Calibration lookups for one recipe, cached per (GPU name, compute capability, GPU count), and per interconnect
    for a recipe on several GPUs (docs/fleet.md, "Several GPUs")."""

    def __init__(self, calibration: Calibration, recipe: Workload):
        self.calibration = calibration
        self.recipe = recipe
        self.multi_gpu = recipe.gpus > 1
        # What the throughput on an offer depends on: offers with the same key share it. An attrgetter: the ranking
        # reads it for every offer that passes.
        self.key = attrgetter("gpu_name", "compute_capability", "num_gpus",
                              *(("nvlink_gb_s",) if self.multi_gpu else ()))
        self._cache: dict[tuple, Throughput | None] = {}
        self.best_tokens_per_s = tokens_per_s(calibration.best_model_tflops(), recipe)
        self._tokens_per_model_tflop = tokens_per_s(1.0, recipe)
        self._paths = {cc: resolve_kernel_path(recipe.kernel_path, cc) for cc in (80, 86, 89, 90, 100, 120)}

    def scale(self, offer: OfferRecord) -> float:
        """The box's throughput in GPUs' worth of one GPU's."""
        if not self.multi_gpu:
            return _gpu_scale(offer.num_gpus)
        return _gpu_scale(self.recipe.gpus) * (PCIE_ALL_TO_ALL_FACTOR if over_pcie(offer) else 1.0)

    def one_gpu_share(self, offer: OfferRecord, tokens_per_second: float) -> float:
        """One GPU's share of a box's throughput, to anchor spec-sheet figures on: over the box's GPUs for a one-GPU
        recipe (as the ranking always has), over the GPUs' worth it was scaled by for a recipe on several."""
        return tokens_per_second / (self.scale(offer) if self.multi_gpu else offer.num_gpus)

    def _scale_words(self, offer: OfferRecord) -> str:
        if not self.multi_gpu:
            return ""
        n = self.recipe.gpus
        spare = f" of {offer.num_gpus}" if offer.num_gpus > n else ""
        if over_pcie(offer):
            link = f"; no NVLink: x{PCIE_ALL_TO_ALL_FACTOR:g} for the expert all-to-all over PCIe"
        else:
            link = "" if offer.nvlink_gb_s else "; interconnect not listed"
        return f"; {n}{spare} GPUs at {MULTI_GPU_EFFICIENCY:.0%} each{link}"

    def calibrated(self, offer: OfferRecord) -> Throughput | None:
        key = self.key(offer)
        try:
            return self._cache[key]
        except KeyError:
            pass
        path = resolve_kernel_path(self.recipe.kernel_path, offer.compute_capability)
        entry = self._lookup(gpu_model_key(offer.gpu_name), path)
        result = None
        if entry is not None:
            runs = f"{entry.measured_runs} run{'s' if entry.measured_runs != 1 else ''}" if entry.measured_runs \
                else "seed figure"
            result = Throughput(
                tokens_per_s(entry.model_tflops, self.recipe) * self.scale(offer),
                path,
                False,
                f"calibrated {entry.gpu_model}/{path} ({runs}){self._scale_words(offer)}",
            )
        self._cache[key] = result
        return result

    def _lookup(self, gpu: str, path: str) -> CalibrationEntry | None:
        entries = self.calibration.entries
        entry = entries.get((gpu, path))
        if entry is not None:
            return entry
        # "H200 NVL" -> "H200", "RTX PRO 6000 WS" -> "RTX PRO 6000": the longest calibrated word-prefix.
        words = gpu.split()
        for n in range(len(words) - 1, 0, -1):
            entry = entries.get((" ".join(words[:n]), path))
            if entry is not None:
                return entry
        return None

    def estimate(self, offer: OfferRecord, listed_to_model: float | None = None,
                 dlperf_to_model: float | None = None) -> Throughput | None:
        """From the offer's own listed compute, at a ratio anchored on calibrated offers where the caller has one.

        Capped at the best calibrated card: this recipe stopped scaling with compute at H200/B200.
        """
        speed = self.estimate_tokens_per_s(offer, listed_to_model, dlperf_to_model)
        if speed is None:
            return None
        path = self._paths.get(offer.compute_capability) or resolve_kernel_path(
            self.recipe.kernel_path, offer.compute_capability)
        n = offer.num_gpus or 1
        flops, dlperf = offer.total_flops, offer.dlperf
        # A speed was estimated, so the offer lists one of the two.
        basis = "%g listed TFLOPS" % (flops / n) if flops and flops > 0 else "DLPerf %g" % ((dlperf or 0) / n)
        return _new_throughput(Throughput, (speed, path, True,
                                            f"estimate from {basis} (no calibration){self._scale_words(offer)}"))

    def estimate_tokens_per_s(self, offer: OfferRecord, listed_to_model: float | None = None,
                              dlperf_to_model: float | None = None) -> float | None:
        """`estimate(...).tokens_per_s` alone: what the ranking scores on, without the words of its source."""
        n = offer.num_gpus or 1
        flops = offer.total_flops
        if flops and flops > 0:
            per_gpu_tflops = flops / n * (listed_to_model or DEFAULT_LISTED_TO_MODEL_TFLOPS)
        elif offer.dlperf and offer.dlperf > 0 and dlperf_to_model:
            per_gpu_tflops = offer.dlperf / n * dlperf_to_model
        else:
            return None
        per_gpu = per_gpu_tflops * self._tokens_per_model_tflop * ESTIMATE_DISCOUNT
        if self.best_tokens_per_s and per_gpu > self.best_tokens_per_s:
            per_gpu = self.best_tokens_per_s
        return per_gpu * self.estimate_scale(offer)

    def estimate_scale(self, offer: OfferRecord) -> float:
        """What an estimate's one-GPU speed is multiplied by for the box (1.0 for one GPU: the same float)."""
        return self.scale(offer) if self.multi_gpu else _gpu_scale(offer.num_gpus or 1)

    def estimate_columns(self, total_flops: np.ndarray, dlperf: np.ndarray, num_gpus: np.ndarray,
                         listed_to_model: np.ndarray, dlperf_to_model: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """`estimate_tokens_per_s` for many offers at once, bit for bit, one value per offer in each column; a blank
        figure is NaN, and NaN comes out where `estimate_tokens_per_s` says None."""
        with np.errstate(invalid="ignore"):
            per_gpu_tflops = np.where(
                total_flops > 0, total_flops / num_gpus * listed_to_model,
                np.where((dlperf > 0) & (dlperf_to_model != 0), dlperf / num_gpus * dlperf_to_model, np.nan))
            per_gpu = per_gpu_tflops * self._tokens_per_model_tflop * ESTIMATE_DISCOUNT
            if self.best_tokens_per_s:
                per_gpu = np.where(per_gpu > self.best_tokens_per_s, self.best_tokens_per_s, per_gpu)
        return per_gpu * scale


def anchor_ratio(achieved: np.ndarray, listed: np.ndarray) -> float | None:
    """Median of achieved-per-GPU over listed-per-GPU across calibrated offers (one pair a place in the two columns;
    a pair with no positive listed figure counts for nothing): the catalogue's own unit. The median is
    statistics.median's, the mean of the middle two for an even count."""
    with np.errstate(invalid="ignore"):
        usable = listed > 0
    ratios = np.sort(achieved[usable] / listed[usable]).tolist()
    if not ratios:
        return None
    middle = len(ratios) // 2
    return ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2


def _gpu_scale(num_gpus: int) -> float:
    return 1.0 if num_gpus <= 1 else num_gpus * MULTI_GPU_EFFICIENCY
