from django import forms

from fleet.models import OfferProfile
from training.recipe import RecipeError, parse_recipe_text


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=100)
    recipe = forms.CharField(widget=forms.Textarea(attrs={"rows": 18, "cols": 80}),
                             help_text="the training recipe, YAML or JSON (see training/recipe.py)")
    profile = forms.ModelChoiceField(queryset=OfferProfile.objects.order_by("name"), required=False,
                                     help_text="how offers are ranked; the defaults when empty")
    bucket = forms.CharField(max_length=300, help_text="s3://bucket/prefix, or an absolute local folder")
    budget_usd = forms.DecimalField(min_value=0.01, max_digits=10, decimal_places=2, label="Budget ($)")
    max_restarts = forms.IntegerField(min_value=0, max_value=50, initial=3)

    def clean_recipe(self):
        text = self.cleaned_data["recipe"]
        try:
            recipe = parse_recipe_text(text, as_json=text.lstrip().startswith("{"))
        except RecipeError as exc:
            raise forms.ValidationError(f"The recipe cannot be read: {exc}.") from None
        if not isinstance(recipe, dict):
            raise forms.ValidationError("The recipe must be a mapping of settings.")
        return recipe
