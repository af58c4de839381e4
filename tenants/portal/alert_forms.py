"""The portal's forms for budget alerts: a destination (email or webhook URL) and a budget's
rules (thresholds as comma-separated percentages, and the forecast)."""

from django import forms

from tenants.models import AlertDestination
from tenants.portal.forms import PortalForm


class DestinationForm(PortalForm):
    kind = forms.ChoiceField(choices=AlertDestination.Kind.choices, label="Send by")
    target = forms.CharField(
        max_length=2000,
        label="Email address or webhook URL",
        help_text="Webhooks get a signed JSON POST (https:// to a public address).",
    )


class RulesForm(PortalForm):
    thresholds = forms.CharField(
        required=False,
        max_length=100,
        label="Thresholds (%)",
        help_text="Comma-separated, e.g. 50, 80, 100. Empty: none.",
    )
    forecast = forms.BooleanField(
        required=False,
        label="Forecast",
        help_text="Alert when this window is projected to run out before it ends.",
    )

    def clean_thresholds(self) -> list[int]:
        text = self.cleaned_data["thresholds"]
        try:
            return [int(part) for part in text.replace(" ", "").split(",") if part]
        except ValueError:
            raise forms.ValidationError("Use whole percentages separated by commas.") from None
