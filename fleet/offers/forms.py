"""The Offers page's recipe and filter form: plain fields in, a Workload and OfferFilters out."""

import re
from decimal import Decimal

from django import forms
from django.conf import settings
from django.utils.text import slugify

from fleet.offers.profiles import NAME_MAX
from fleet.ranking import GPU_TIERS, PRESETS, OfferFilters, Phase, Workload
from fleet.ranking.workload import KERNEL_PATHS, MAX_GPUS

SORTS = {
    "score": "steps per dollar",
    "total": "projected total cost",
    "wall": "projected wall time",
    "price": "$/h all-in",
}


def format_phases(phases) -> str:
    return " ".join(f"{p.name}:{p.steps}" for p in phases)


MAX_PHASES = 20
MAX_PHASE_STEPS = 10_000_000  # what a run's metric records allow a phase
MAX_TOKENS_PER_STEP = 1 << 26  # 67M tokens a step: far past any fine-tune, and the run cost stays a number


def parse_phases(text: str) -> tuple[Phase, ...]:
    phases = []
    for item in text.replace(",", " ").split():
        name, _, steps = item.partition(":")
        if not name or not steps.isdigit() or int(steps) < 1:
            raise forms.ValidationError(f"{item!r} is not phase:steps (for example sft:1500).")
        if int(steps) > MAX_PHASE_STEPS:
            raise forms.ValidationError(f"{item!r}: a phase has at most {MAX_PHASE_STEPS:,} steps.")
        phases.append(Phase(name.lower(), int(steps)))
    if not phases:
        raise forms.ValidationError("A run needs at least one phase.")
    if len(phases) > MAX_PHASES:
        raise forms.ValidationError(f"A run has at most {MAX_PHASES} phases, not {len(phases)}.")
    return tuple(phases)


def _ranged(field_class, low, high, **kwargs):
    """A number field that says its range in its message, in the user's words. It is a text input: a number input
    sends nothing for what the browser cannot read ("abc", "NaN"), which a blank optional field takes as unset."""
    whole = field_class is forms.IntegerField
    messages = {"min_value": f"At least {low:,}.", "max_value": f"At most {high:,}.",
                "invalid": "Enter a whole number." if whole else "Enter a number, such as 1.5 (NaN and inf are not)."}
    widget = forms.TextInput(attrs={"inputmode": "numeric" if whole else "decimal", "autocomplete": "off"})
    return field_class(min_value=low, max_value=high, error_messages=messages, widget=widget, **kwargs)


class RankingForm(forms.Form):
    # The recipe
    preset = forms.ChoiceField(choices=[(k, k) for k in PRESETS], required=False)
    total_params_b = _ranged(forms.FloatField, 0.1, 10_000, label="Total params (B)")
    active_params_b = _ranged(forms.FloatField, 0.1, 10_000, label="Active params (B)")
    lora_rank = _ranged(forms.IntegerField, 1, 4096, label="LoRA rank")
    batch_size = _ranged(forms.IntegerField, 1, 65_536, label="Batch size")
    grad_accum = _ranged(forms.IntegerField, 1, 65_536, label="Grad accumulation")
    seq_len = _ranged(forms.IntegerField, 128, 1_048_576, label="Sequence length")
    phases = forms.CharField(max_length=2000, help_text="phase:steps, e.g. cpt:1500 sft:1500 dpo:800", label="Phases",
                             widget=forms.Textarea(attrs={"rows": 2}))
    checkpoint_interval_min = _ranged(forms.FloatField, 1, 10_080, label="Checkpoint every (min)")
    kernel_path = forms.ChoiceField(choices=[(k, k) for k in KERNEL_PATHS], label="Kernel path")
    gpus = _ranged(forms.IntegerField, 1, MAX_GPUS, required=False, label="GPUs",
                   help_text="of one box the trainer runs on, one rank each; blank: 1")
    # The filters
    gpu_tiers = forms.MultipleChoiceField(choices=[(k, v[0]) for k, v in GPU_TIERS.items()], required=False,
                                         widget=forms.CheckboxSelectMultiple, help_text="none checked: any GPU",
                                         label="GPU tiers")
    max_usd_per_hour = _ranged(forms.DecimalField, Decimal("0.01"), Decimal(1000), required=False,
                               max_digits=10, decimal_places=4, label="Price cap $/h", help_text="blank: no cap")
    min_driver_version = forms.CharField(required=False, max_length=40, label="Min driver")
    min_cuda = _ranged(forms.FloatField, 0, 99, label="Min CUDA")
    min_disk_gb = _ranged(forms.FloatField, 0, 1_000_000, label="Min disk GB")
    min_inet_down_mbps = _ranged(forms.FloatField, 0, 1_000_000, label="Min down Mb/s")
    min_inet_up_mbps = _ranged(forms.FloatField, 0, 1_000_000, label="Min up Mb/s")
    locations = forms.CharField(required=False, max_length=500, label="Locations",
                                help_text="EU, NA, APAC or two-letter country codes (vast.ai's geolocation in); "
                                          "blank: anywhere")
    excluded_locations = forms.CharField(required=False, max_length=500, label="Not in",
                                         help_text="regions or country codes kept out (geolocation notin)")
    min_reliability = _ranged(forms.FloatField, 0, 1, label="Min reliability")
    require_verified = forms.BooleanField(required=False, label="Verified hosts only")
    allow_bids = forms.BooleanField(required=False, label="Allow bid (interruptible)")
    min_gpus = _ranged(forms.IntegerField, 1, 1024, label="Min GPUs")
    max_gpus = _ranged(forms.IntegerField, 1, 1024, required=False, label="Max GPUs")
    datacenter_only = forms.BooleanField(required=False, label="Datacenter hosts only")
    min_gpu_mem_bw_gb_s = _ranged(forms.FloatField, 0, 100_000, required=False, label="Min GPU memory GB/s",
                                  help_text="each GPU's memory bandwidth; blank: any")
    # The view
    sort = forms.ChoiceField(choices=list(SORTS.items()), required=False, label="Sort by")
    find = forms.CharField(required=False, max_length=200, label="Find offer")

    RECIPE_FIELDS = ["total_params_b", "active_params_b", "lora_rank", "batch_size", "grad_accum", "seq_len",
                     "kernel_path", "gpus"]
    FILTER_FIELDS = ["gpu_tiers", "max_usd_per_hour", "min_driver_version", "min_cuda", "min_disk_gb",
                     "min_inet_down_mbps", "min_inet_up_mbps", "min_reliability", "require_verified", "allow_bids",
                     "min_gpus", "max_gpus", "datacenter_only", "min_gpu_mem_bw_gb_s"]
    LOCATION_FIELDS = ["locations", "excluded_locations"]  # typed as comma-separated codes
    # The recipe's and the filters' own names for what a field sets, where they differ from the field's name.
    _SETS = {"checkpoint_interval_s": "checkpoint_interval_min"}

    @classmethod
    def data_for(cls, recipe: Workload, filters: OfferFilters, preset: str = "") -> dict:
        """Form data that reproduces a recipe and filters (a profile, or the defaults)."""
        data = {name: getattr(recipe, name) for name in cls.RECIPE_FIELDS}
        data.update(preset=preset, phases=format_phases(recipe.phases),
                    checkpoint_interval_min=recipe.checkpoint_interval_s / 60, sort="score", find="")
        saved = filters.to_dict()
        data.update({name: saved[name] for name in cls.FILTER_FIELDS})
        for name in cls.LOCATION_FIELDS:
            data[name] = ", ".join(saved[name])
        data["min_gpu_mem_bw_gb_s"] = saved["min_gpu_mem_bw_gb_s"] or ""
        data["max_usd_per_hour"] = saved["max_usd_per_hour"] or ""
        data["max_gpus"] = saved["max_gpus"] or ""
        return data

    def clean_gpus(self):
        return self.cleaned_data["gpus"] or 1  # a link saved before the field existed trains on one

    def clean_phases(self):
        return parse_phases(self.cleaned_data["phases"])

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        self._check_together(cleaned)
        if self.errors:
            return cleaned
        base = PRESETS.get(cleaned.get("preset") or "", Workload())
        try:
            self.recipe = Workload.from_dict({
                **base.to_dict(), **{name: cleaned[name] for name in self.RECIPE_FIELDS},
                "phases": [[p.name, p.steps] for p in cleaned["phases"]],
                "checkpoint_interval_s": cleaned["checkpoint_interval_min"] * 60,
                "rent_disk_gb": float(settings.RENT_DISK_GB),  # the run is priced with the disk a rent takes
            })
            self.filters = OfferFilters.from_dict({
                **{name: cleaned[name] for name in self.FILTER_FIELDS},
                "min_gpu_mem_bw_gb_s": cleaned["min_gpu_mem_bw_gb_s"] or 0.0,
                **{name: [part.strip().upper() for part in cleaned[name].split(",") if part.strip()]
                   for name in self.LOCATION_FIELDS},
            })
        except ValueError as exc:
            self._add_problem(str(exc))
        return cleaned

    def _check_together(self, cleaned) -> None:
        """What the fields' own ranges cannot say: the values that only make sense together."""
        if cleaned["active_params_b"] > cleaned["total_params_b"]:
            self.add_error("active_params_b", f"At most the total params ({cleaned['total_params_b']:g} B).")
        tokens = cleaned["batch_size"] * cleaned["grad_accum"] * cleaned["seq_len"]
        if tokens > MAX_TOKENS_PER_STEP:
            self.add_error("batch_size", f"Batch size x grad accumulation x sequence length is {tokens:,} tokens a "
                                         f"step; at most {MAX_TOKENS_PER_STEP:,}.")
        if cleaned.get("max_gpus") is not None and cleaned["max_gpus"] < cleaned["min_gpus"]:
            self.add_error("max_gpus", f"At least the min GPUs ({cleaned['min_gpus']}).")

    def _add_problem(self, message: str) -> None:
        """A recipe's or filter's refusal, next to the field it is about and in that field's words."""
        for problem in message.split("; "):
            name = re.match(r"[a-z_]+", problem)
            field = self._SETS.get(name.group(), name.group()) if name else None
            if name and field in self.fields:
                text = problem[len(name.group()):].strip(" :")
                self.add_error(field, text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."))
            else:
                self.add_error(None, problem)

    def error_list(self) -> list[tuple[str, str, str]]:
        """Every error as (field name, the field's label, message); the form's own errors name no field."""
        return [(name, self[name].label if name in self.fields else "", message)
                for name, messages in self.errors.items() for message in messages]


class ProfileNameForm(forms.Form):
    """The name a profile is saved under: at most NAME_MAX characters, made a slug ("Team H200" is team-h200)."""

    profile_name = forms.CharField(label="Save these settings as a profile", max_length=NAME_MAX, error_messages={
        "required": "Give the profile a name.",
        "max_length": f"At most {NAME_MAX} characters (this has %(show_value)d).",
    }, widget=forms.TextInput(attrs={"placeholder": "e.g. h200-eu", "autocomplete": "off"}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # No maxlength: a browser cuts a longer paste short without a word; the check says it beside the field.
        self.fields["profile_name"].widget.attrs.pop("maxlength", None)

    def clean_profile_name(self):
        name = slugify(self.cleaned_data["profile_name"])
        if not name:
            raise forms.ValidationError("Use letters or digits: the name becomes a slug, such as h200-eu.")
        if len(name) > NAME_MAX:
            raise forms.ValidationError(f"At most {NAME_MAX} characters as a slug (this has {len(name)}).")
        return name
