"""What the Inference fleet page takes: a model to serve (new or changed) and a model's desired replica count, each
number within what the fleet can act on, each refusal by its field."""

import re

from django import forms

from fleet.models import InferenceModel, OfferProfile

MAX_DESIRED_REPLICAS = 100
MAX_REPLACEMENTS_PER_DAY = 100
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")  # a registry reference: no spaces, no shell characters


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
