"""The Offers page's recipe and filter form: plain fields in, a Recipe and OfferFilters out."""

from decimal import Decimal

from django import forms

from fleet.ranking import GPU_TIERS, PRESETS, OfferFilters, Phase, Recipe
from fleet.ranking.recipe import KERNEL_PATHS

SORTS = {
    "score": "steps per dollar",
    "total": "projected total cost",
    "wall": "projected wall time",
    "price": "$/h all-in",
}


def format_phases(phases) -> str:
    return " ".join(f"{p.name}:{p.steps}" for p in phases)


def parse_phases(text: str) -> tuple[Phase, ...]:
    phases = []
    for item in text.replace(",", " ").split():
        name, _, steps = item.partition(":")
        if not name or not steps.isdigit() or int(steps) < 1:
            raise forms.ValidationError(f"{item!r} is not phase:steps (for example sft:1500).")
        phases.append(Phase(name.lower(), int(steps)))
    if not phases:
        raise forms.ValidationError("A run needs at least one phase.")
    return tuple(phases)


class RankingForm(forms.Form):
    # The recipe
    preset = forms.ChoiceField(choices=[(k, k) for k in PRESETS], required=False)
    total_params_b = forms.FloatField(min_value=0.1, label="Total params (B)")
    active_params_b = forms.FloatField(min_value=0.1, label="Active params (B)")
    lora_rank = forms.IntegerField(min_value=1, label="LoRA rank")
    batch_size = forms.IntegerField(min_value=1)
    grad_accum = forms.IntegerField(min_value=1, label="Grad accumulation")
    seq_len = forms.IntegerField(min_value=128, label="Sequence length")
    phases = forms.CharField(help_text="phase:steps, e.g. cpt:1500 sft:1500 dpo:800")
    checkpoint_interval_min = forms.FloatField(min_value=1, label="Checkpoint every (min)")
    kernel_path = forms.ChoiceField(choices=[(k, k) for k in KERNEL_PATHS])
    # The filters
    gpu_tiers = forms.MultipleChoiceField(choices=[(k, v[0]) for k, v in GPU_TIERS.items()], required=False,
                                         widget=forms.CheckboxSelectMultiple, help_text="none checked: any GPU")
    max_usd_per_hour = forms.DecimalField(min_value=Decimal("0.01"), required=False, label="Price cap $/h",
                                          help_text="blank: no cap")
    min_driver_version = forms.CharField(required=False, label="Min driver")
    min_cuda = forms.FloatField(min_value=0, label="Min CUDA")
    min_disk_gb = forms.FloatField(min_value=0, label="Min disk GB")
    min_inet_down_mbps = forms.FloatField(min_value=0, label="Min down Mb/s")
    min_inet_up_mbps = forms.FloatField(min_value=0, label="Min up Mb/s")
    locations = forms.CharField(required=False, help_text="EU, NA, APAC or country codes; blank: anywhere")
    min_reliability = forms.FloatField(min_value=0, max_value=1)
    require_verified = forms.BooleanField(required=False, label="Verified hosts only")
    allow_bids = forms.BooleanField(required=False, label="Allow bid (interruptible)")
    min_gpus = forms.IntegerField(min_value=1, label="Min GPUs")
    max_gpus = forms.IntegerField(min_value=1, required=False, label="Max GPUs")
    # The view
    sort = forms.ChoiceField(choices=list(SORTS.items()), required=False)
    find = forms.CharField(required=False, label="Find offer")

    RECIPE_FIELDS = ["total_params_b", "active_params_b", "lora_rank", "batch_size", "grad_accum", "seq_len",
                     "kernel_path"]
    FILTER_FIELDS = ["gpu_tiers", "max_usd_per_hour", "min_driver_version", "min_cuda", "min_disk_gb",
                     "min_inet_down_mbps", "min_inet_up_mbps", "min_reliability", "require_verified", "allow_bids",
                     "min_gpus", "max_gpus"]

    @classmethod
    def data_for(cls, recipe: Recipe, filters: OfferFilters, preset: str = "") -> dict:
        """Form data that reproduces a recipe and filters (a profile, or the defaults)."""
        data = {name: getattr(recipe, name) for name in cls.RECIPE_FIELDS}
        data.update(preset=preset, phases=format_phases(recipe.phases),
                    checkpoint_interval_min=recipe.checkpoint_interval_s / 60, sort="score", find="")
        saved = filters.to_dict()
        data.update({name: saved[name] for name in cls.FILTER_FIELDS})
        data["locations"] = ", ".join(saved["locations"])
        data["max_usd_per_hour"] = saved["max_usd_per_hour"] or ""
        data["max_gpus"] = saved["max_gpus"] or ""
        return data

    def clean_phases(self):
        return parse_phases(self.cleaned_data["phases"])

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        base = PRESETS.get(cleaned.get("preset") or "", Recipe())
        try:
            self.recipe = Recipe.from_dict({
                **base.to_dict(), **{name: cleaned[name] for name in self.RECIPE_FIELDS},
                "phases": [[p.name, p.steps] for p in cleaned["phases"]],
                "checkpoint_interval_s": cleaned["checkpoint_interval_min"] * 60,
            })
            self.filters = OfferFilters.from_dict({
                **{name: cleaned[name] for name in self.FILTER_FIELDS},
                "locations": [part.strip().upper() for part in cleaned["locations"].split(",") if part.strip()],
            })
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return cleaned
