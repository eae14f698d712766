"""What the Inference fleet page takes: a model to serve (new or changed), a model's desired replica count, and a
finished run's adapter to serve; each number within what the fleet can act on, each refusal by its field."""

import re

from django import forms

from fleet.inference.adapters import NAME as ADAPTER_NAME
from fleet.models import InferenceModel, OfferProfile

MAX_DESIRED_REPLICAS = 100
MAX_REPLACEMENTS_PER_DAY = 100
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")  # a registry reference: no spaces, no shell characters
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")  # a hub branch, tag or commit


class DesiredReplicasForm(forms.Form):
    desired_replicas = forms.IntegerField(min_value=0, max_value=MAX_DESIRED_REPLICAS)


class InferenceModelForm(forms.ModelForm):
    name = forms.CharField(max_length=200, help_text="the model id as its server's /v1/models lists it, "
                                                     "e.g. Qwen/Qwen3-30B-A3B")
    image = forms.CharField(max_length=300, label="Serving image", help_text="e.g. vllm/vllm-openai:v0.9.2")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=8000,
                              help_text="the container port that serves /v1/models")
    desired_replicas = forms.IntegerField(min_value=0, max_value=MAX_DESIRED_REPLICAS, initial=1)
    max_replacements_per_day = forms.IntegerField(
        min_value=0, max_value=MAX_REPLACEMENTS_PER_DAY, initial=3, label="Replacements a day",
        help_text="boxes rented for this model a day at most, replacements included")
    profile = forms.ModelChoiceField(OfferProfile.objects.order_by("name"), required=False, label="Ranked with",
                                     empty_label="the defaults", to_field_name="name",
                                     help_text="the offer profile its boxes are ranked with")

    class Meta:
        model = InferenceModel
        fields = ["name", "image", "port", "desired_replicas", "max_replacements_per_day", "profile"]

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not name or any(c.isspace() or not c.isprintable() for c in name):
            raise forms.ValidationError("A model id has no spaces: write it as /v1/models lists it.")
        taken = InferenceModel.objects.filter(name=name).exclude(pk=self.instance.pk)
        if taken.exists():
            raise forms.ValidationError(f"An inference model named {name} exists already.")
        return name

    def clean_image(self):
        image = self.cleaned_data["image"].strip()
        if not IMAGE.fullmatch(image):
            raise forms.ValidationError("An image reference is letters, digits and . _ / : @ + - only, "
                                        "e.g. vllm/vllm-openai:v0.9.2.")
        return image


# The vLLM releases bench/serve_check.py has served the trainer's exports with on a GPU, per model family: greedy
# answers as transformers + peft gives them within bf16, the adapter in effect (bench/NOTES_serve_check.md).
CHECKED_VLLM = {"Qwen3-MoE": (0, 26, 0)}
VLLM_IMAGE = "vllm/vllm-openai:v0.26.0"  # the release checked on Qwen3-MoE
# Qwen3.5/3.6-MoE's fused 3-D expert LoRA: the first release whose loader reads it (from vLLM's source; not yet served
# by serve_check: it needs a newer torch than the GPU machine's), so its default image, with the form saying it is
# unchecked. serve_check ran v0.26.0 on tiny Qwen3.5-MoE models, twice as the published configs shape them (M-RoPE
# sections): its base model alone answered apart from transformers' (up to 2.4-4.6 nats a token, 3 to 10 of 32
# answers equal; bench/NOTES_serve_check.md), so no adapter check could pass there.
QWEN3_5_VLLM_IMAGE = "vllm/vllm-openai:v0.34.0"
CHECKED_BEFORE_QWEN3_5 = (0, 26, 0)
VLLM_TAG = re.compile(r"(?:docker\.io/)?vllm/vllm-openai:v(\d+)\.(\d+)\.(\d+)")
FIRST_MOE_LORA_VLLM = (0, 11, 2)  # the first that loads LoRA on fused MoE experts (per-expert, Qwen3-MoE)
FIRST_QWEN3_5_MOE_LORA_VLLM = (0, 34, 0)  # the first that loads the 3-D expert LoRA of Qwen3.5/3.6-MoE
QWEN3_5_NAMES = re.compile(r"qwen3[._]?[56]", re.IGNORECASE)
MAX_VRAM_GB = 2000.0


class ServeAdapterForm(forms.Form):
    """Serving one of a finished run's adapters: which one (the caller offers the checkpoints that hold a vLLM
    export), under what name, on what base, with how many replicas on boxes of how much VRAM."""

    checkpoint = forms.TypedChoiceField(coerce=int, label="Adapter", help_text="a phase's final adapter")
    name = forms.CharField(max_length=100, label="Adapter name",
                           help_text="what /v1/models lists it as and requests name as their model")
    base_model = forms.CharField(max_length=300, label="Base model",
                                 help_text="the model vLLM loads under it: a hub id (Qwen/Qwen3-30B-A3B) or a path")
    base_revision = forms.CharField(max_length=200, required=False, label="Base revision",
                                    help_text="the hub branch, tag or commit the adapter was trained on (vLLM's "
                                              "--revision); empty: the hub's default branch")
    image = forms.CharField(max_length=300, initial=VLLM_IMAGE, label="Serving image",
                            help_text="a vLLM image; it runs with --enable-lora")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=8000,
                              help_text="the container port that serves /v1/models")
    desired_replicas = forms.IntegerField(min_value=1, max_value=MAX_DESIRED_REPLICAS, initial=1, label="Replicas")
    max_replacements_per_day = forms.IntegerField(
        min_value=0, max_value=MAX_REPLACEMENTS_PER_DAY, initial=3, label="Replacements a day",
        help_text="boxes rented for this model a day at most, replacements included")
    vram_needed_gb = forms.FloatField(min_value=0.1, max_value=MAX_VRAM_GB, label="VRAM needed (GB per GPU)",
                                      help_text="offers with less are not rented: the base's weights and its KV cache")
    profile = forms.ModelChoiceField(OfferProfile.objects.order_by("name"), required=False, label="Ranked with",
                                     empty_label="the defaults", to_field_name="name",
                                     help_text="the offer profile its boxes are ranked with")

    def __init__(self, *args, adapters: list[tuple[int, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["checkpoint"].choices = adapters
        base = self.initial.get("base_model") or ""
        self.fields["image"].initial = default_image(base)
        self.fields["image"].help_text = f"a vLLM image; it runs with --enable-lora. {checked_words(base)}"

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not ADAPTER_NAME.fullmatch(name):
            raise forms.ValidationError("An adapter name is up to 100 letters, digits and . _ - (no spaces), "
                                        "starting with a letter or digit.")
        if InferenceModel.objects.filter(name=name).exists():
            raise forms.ValidationError(f"An inference model named {name} exists already.")
        return name

    def clean_base_model(self):
        base = self.cleaned_data["base_model"].strip()
        if not base or any(c.isspace() or not c.isprintable() for c in base):
            raise forms.ValidationError("A model id has no spaces: write it as vLLM takes it.")
        return base

    def clean_base_revision(self):
        revision = self.cleaned_data["base_revision"].strip()
        if revision and not REVISION.fullmatch(revision):
            raise forms.ValidationError("A revision is a branch, tag or commit: letters, digits and . _ / - only.")
        return revision

    def clean_image(self):
        image = self.cleaned_data["image"].strip()
        if not IMAGE.fullmatch(image):
            raise forms.ValidationError("An image reference is letters, digits and . _ / : @ + - only, "
                                        f"e.g. {VLLM_IMAGE}.")
        return image

    def clean(self):
        data = super().clean()
        problem = serving_image_problem(data.get("image", ""), data.get("base_model", ""))
        if problem:
            self.add_error("image", problem)
        return data


def serving_image_problem(image: str, base_model: str) -> str:
    """Why a vLLM release tag cannot serve this base's adapter ("" when it can or when the image is not a release
    tag, e.g. a digest or a build of one's own). A box on it would start vLLM, fail to load, and be replaced until
    the day's budget is spent."""
    match = VLLM_TAG.fullmatch(image)
    if not match:
        return ""
    version = tuple(int(part) for part in match.groups())
    if QWEN3_5_NAMES.search(base_model) and version < FIRST_QWEN3_5_MOE_LORA_VLLM:
        why, first = "cannot serve a Qwen3.5/3.6-MoE adapter (its experts' fused LoRA layout)", \
            FIRST_QWEN3_5_MOE_LORA_VLLM
    elif version < FIRST_MOE_LORA_VLLM:
        why, first = "loads no LoRA on MoE experts", FIRST_MOE_LORA_VLLM
    else:
        return ""
    return f"vLLM {_dotted(version)} {why}: use v{_dotted(first)} or later, e.g. {default_image(base_model)}."


def family(base_model: str) -> str:
    """The model family a base's adapters are exported for, as serve_check names it."""
    return "Qwen3.5/3.6-MoE" if QWEN3_5_NAMES.search(base_model) else "Qwen3-MoE"


def default_image(base_model: str) -> str:
    """The serve form's vLLM image for this base: the release checked with its family, else the first that loads it."""
    return QWEN3_5_VLLM_IMAGE if family(base_model) != "Qwen3-MoE" else VLLM_IMAGE


def checked_words(base_model: str) -> str:
    """What the serve form says of the release its image names for this base: checked, or not yet."""
    checked = CHECKED_VLLM.get(family(base_model))
    if checked:
        return f"vLLM v{_dotted(checked)} has served {family(base_model)} adapters as peft answers them."
    return (f"No vLLM release has yet served {family(base_model)} adapters as peft answers them: on a GPU, "
            f"v{_dotted(CHECKED_BEFORE_QWEN3_5)} answered apart from transformers even without an adapter, and "
            f"v{_dotted(FIRST_QWEN3_5_MOE_LORA_VLLM)}, the first whose loader reads their fused experts, is not yet "
            f"checked; ask the adapter a few prompts before sending it traffic.")


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
