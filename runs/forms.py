from django import forms
from django.conf import settings

from fleet import volumes
from fleet.models import OfferProfile
from runs import launch as launching
from runs import launch_plan
from training.recipe import MAX_RECIPE_CHARS, RecipeError, parse_recipe_text


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class DataFilesField(forms.FileField):
    """Any number of files, cleaned to {file name: uploaded file}."""

    widget = MultipleFileInput

    def clean(self, data, initial=None):
        one = super().clean
        files = [one(d, initial) for d in data] if isinstance(data, (list, tuple)) else [one(data, initial)] if data \
            else []
        named = {}
        for f in files:
            if f.size > settings.DATASET_MAX_BYTES:
                raise forms.ValidationError(f"{f.name} is {f.size:,} bytes, more than the "
                                            f"{settings.DATASET_MAX_BYTES:,} a data file may be (DATASET_MAX_BYTES).")
            if f.name in named:
                raise forms.ValidationError(f"Two files are named {f.name}: a phase names its file by name.")
            named[f.name] = f
        return named


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=100)
    # No maxlength on the recipe: a browser cuts a longer paste short without a word; static/js/form-limits.js stops a
    # submit that is over data-max-chars (or a file over data-max-bytes) and says so beside the field.
    recipe = forms.CharField(widget=forms.Textarea(attrs={"rows": 18, "cols": 80,
                                                          "data-max-chars": MAX_RECIPE_CHARS}),
                             help_text=f"the training recipe, YAML or JSON (see training/recipe.py), at most "
                                       f"{MAX_RECIPE_CHARS:,} characters")
    data_files = DataFilesField(
        required=False, label="Data files (JSONL)",
        widget=MultipleFileInput(attrs={"accept": ".jsonl,.json"}),
        help_text="each phase's data: a file chosen here, named in the recipe by its file name (data: sft.jsonl); "
                  "or a stored data set's name, an s3://bucket/key object, or example:sft.jsonl. It is checked "
                  "before anything is rented and stored in the bucket")
    profile = forms.ModelChoiceField(queryset=OfferProfile.objects.order_by("name"), required=False,
                                     help_text="how offers are ranked; the defaults when empty")
    bucket = forms.CharField(max_length=300, help_text="s3://bucket/prefix, or an absolute local folder")
    # Numbers are text inputs: a number input sends nothing for what the browser cannot read ("abc"), which a blank
    # Disk (GB) takes as "what the model needs" instead of a refusal beside the field.
    budget_usd = forms.DecimalField(min_value=0.01, max_digits=10, decimal_places=2, label="Budget ($)",
                                    widget=forms.TextInput(attrs={"inputmode": "decimal"}))
    max_restarts = forms.IntegerField(min_value=0, max_value=50, initial=3,
                                      widget=forms.TextInput(attrs={"inputmode": "numeric"}))
    disk_gb = forms.IntegerField(required=False, min_value=1, max_value=20_000, label="Disk (GB)",
                                 widget=forms.TextInput(attrs={"inputmode": "numeric"}),
                                 help_text="what each box is rented with: blank for what the model needs (said "
                                           "below), or more; never less")

    volume_provider = forms.ChoiceField(
        required=False, label="Volume at", choices=[("", "no volume"), ("vast", "vast.ai"), ("runpod", "RunPod")],
        help_text="keep the base model on a volume of your account between boxes: its boxes are rented only where "
                  "it mounts (a vast.ai volume's machine; RunPod Secure Cloud in the network volume's data centre), "
                  "and once a box has checked the model there against the manifest the dashboard recorded, each "
                  "box's start-up is priced and run without the model's download")
    volume_id = forms.CharField(required=False, max_length=100, label="Volume id",
                                help_text="as `vastai show volumes` or RunPod's network volumes list it")
    volume_mount_path = forms.CharField(required=False, max_length=200, label="Volume mount path",
                                        initial=volumes.DEFAULT_MOUNT_PATH,
                                        help_text=f"where the box mounts it; blank for {volumes.DEFAULT_MOUNT_PATH}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["data_files"].widget.attrs["data-max-bytes"] = settings.DATASET_MAX_BYTES

    def volume(self) -> dict | None:
        """The volume the cleaned form names ({provider, id, mount_path}), or None."""
        data = self.cleaned_data
        if not data.get("volume_provider"):
            return None
        return {"provider": data["volume_provider"], "id": data.get("volume_id") or "",
                "mount_path": data.get("volume_mount_path") or volumes.DEFAULT_MOUNT_PATH}

    def clean(self):
        data = super().clean()
        if data.get("volume_provider") and not data.get("volume_id"):
            self.add_error("volume_id", "Name the volume's id, or choose no volume.")
        elif data.get("volume_id") and not data.get("volume_provider"):
            self.add_error("volume_provider", "Choose the provider the volume is at.")
        return data

    @staticmethod
    def text_bytes_limit() -> int:
        """What the dashboard reads of a request's fields besides files (DATA_UPLOAD_MAX_MEMORY_SIZE)."""
        return settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0

    def chosen_files(self) -> list[str]:
        """The names of the data files this submit carried: a page shown again cannot keep them chosen."""
        return [f.name for f in self.files.getlist("data_files")] if self.is_bound else []

    def clean_recipe(self):
        text = self.cleaned_data["recipe"]
        try:
            recipe = parse_recipe_text(text, as_json=text.lstrip().startswith("{"))
        except RecipeError as exc:
            raise forms.ValidationError(f"The recipe cannot be read: {exc}.") from None
        if not isinstance(recipe, dict):
            raise forms.ValidationError("The recipe must be a mapping of settings.")
        return recipe

    def memory_plan(self):
        """How the form's run fits on the best-ranked card (runs.launch_plan), for the recipe and profile as they
        stand; None while the recipe cannot be read or the plan does not know its model."""
        recipe, profile = self._recipe_and_profile()
        return launch_plan.shown_plan(recipe, profile) if isinstance(recipe, dict) else None

    def _recipe_and_profile(self):
        if not self.is_bound:
            recipe = self.initial.get("recipe")
            return (parse_recipe_text(recipe) if isinstance(recipe, str) else recipe), self.initial.get("profile")
        if "recipe" in getattr(self, "cleaned_data", {}):
            return self.cleaned_data["recipe"], self.cleaned_data.get("profile")
        return None, None

    def disk_need(self):
        """What the form's model needs on each box's disk (runs.launch.disk_need), for the recipe and profile as
        they stand; None while the recipe cannot be read."""
        if not self.is_bound:
            recipe, profile = self.initial.get("recipe"), self.initial.get("profile")
            recipe = parse_recipe_text(recipe) if isinstance(recipe, str) else recipe
        elif "recipe" in getattr(self, "cleaned_data", {}):
            recipe, profile = self.cleaned_data["recipe"], self.cleaned_data.get("profile")
        else:
            return None
        return launching.disk_need(recipe, profile) if isinstance(recipe, dict) else None
