"""The portal's forms: they parse what people type (dollars, comma-separated models, days)
into what the services take; the services' own validation messages are attached to the
fields they name (`form_error_apply`)."""

from decimal import Decimal

from django import forms

from tenants.errors import ApplicationError
from tenants.models import (
    MAX_MICROCENTS,
    MICROCENTS_PER_USD,
    Agent,
    ApiKey,
    Lane,
    Membership,
    Period,
    Role,
    Scope,
    SoftAction,
)

MAX_USD = Decimal(MAX_MICROCENTS) / MICROCENTS_PER_USD
GRACE_CHOICES = [
    (0, "none: stop at once"),
    (300, "5 minutes"),
    (3600, "1 hour"),
    (86400, "1 day"),
    (604800, "7 days"),
]


def form_error_apply(form: forms.Form, exc: ApplicationError, fields: dict | None = None):
    """Show a service's error on the field it names (through `fields`, e.g.
    limit_microcents -> budget_limit_usd), else on the form."""
    name = (fields or {}).get(exc.param, exc.param)
    form.add_error(name if name in form.fields else None, exc.message)


def usd_to_microcents(value: Decimal | None) -> int | None:
    return None if value is None else int(value * MICROCENTS_PER_USD)


class PortalForm(forms.Form):
    """Labels without Django's trailing colon (screen readers read them as typed)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


class BudgetFields(PortalForm):
    budget_period = forms.ChoiceField(
        choices=Period.choices, initial=Period.DAILY, label="Budget period"
    )
    budget_limit_usd = forms.DecimalField(
        required=False,
        min_value=0,
        max_value=MAX_USD,
        decimal_places=8,
        label="Budget (USD)",
        help_text="Empty: no budget of its own (the tenant's budget still applies).",
    )

    budget_soft_limit_usd = forms.DecimalField(
        required=False,
        min_value=0,
        max_value=MAX_USD,
        decimal_places=8,
        label="Soft limit (USD)",
        help_text="Empty: none. Once spent and reserved reach it, the soft action applies.",
    )
    budget_soft_action = forms.ChoiceField(
        choices=SoftAction.choices,
        initial=SoftAction.ALERT,
        required=False,
        label="At the soft limit",
        help_text="alert: only alert; demote: bulk lane; throttle: the rpm below.",
    )
    budget_soft_rpm = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, label="Throttle (requests per minute)"
    )

    def budget(self) -> tuple[str, int | None]:
        return (
            self.cleaned_data["budget_period"],
            usd_to_microcents(self.cleaned_data["budget_limit_usd"]),
        )

    def budget_soft(self) -> dict:
        """The soft level's fields as the budget services take them."""
        return {
            "soft_limit_microcents": usd_to_microcents(self.cleaned_data["budget_soft_limit_usd"]),
            "soft_action": self.cleaned_data["budget_soft_action"] or SoftAction.ALERT,
            "soft_rpm": self.cleaned_data["budget_soft_rpm"],
        }


class AgentForm(BudgetFields):
    name = forms.CharField(max_length=100)
    description = forms.CharField(max_length=500, required=False)
    allowed_models = forms.CharField(
        required=False,
        max_length=4000,
        label="Allowed models",
        help_text="Comma-separated model names; empty: every model the platform serves.",
    )
    lane = forms.ChoiceField(choices=[("", "tenant default"), *Lane.choices], required=False)
    rpm_limit = forms.IntegerField(
        required=False, min_value=1, max_value=10**9, label="Requests per minute"
    )
    tpm_limit = forms.IntegerField(
        required=False, min_value=1, max_value=10**12, label="Tokens per minute"
    )
    concurrency_limit = forms.IntegerField(
        required=False, min_value=1, max_value=10**6, label="Requests at once"
    )
    field_order = [
        "name",
        "description",
        "allowed_models",
        "lane",
        "rpm_limit",
        "tpm_limit",
        "concurrency_limit",
        "budget_period",
        "budget_limit_usd",
        "budget_soft_limit_usd",
        "budget_soft_action",
        "budget_soft_rpm",
    ]

    def agent_fields(self) -> dict:
        data = self.cleaned_data
        models = [m.strip() for m in data["allowed_models"].replace("\n", ",").split(",")]
        return {
            "name": data["name"],
            "description": data["description"],
            "allowed_models": [m for m in models if m],
            "lane": data["lane"],
            "rpm_limit": data["rpm_limit"],
            "tpm_limit": data["tpm_limit"],
            "concurrency_limit": data["concurrency_limit"],
        }


class TenantBudgetForm(BudgetFields):
    pass


SCOPE_CHOICES = [
    ("tenant", "the whole tenant"),
    ("agent", "an agent"),
    ("api_key", "an API key"),
    ("member", "a member (the keys they created)"),
]


class ScopedBudgetForm(BudgetFields):
    """A budget at any scope, optionally for some models only."""

    scope = forms.ChoiceField(choices=SCOPE_CHOICES, label="For")
    agent = forms.ModelChoiceField(queryset=Agent.objects.none(), required=False)
    api_key = forms.ModelChoiceField(
        queryset=ApiKey.objects.none(), required=False, label="API key"
    )
    member = forms.ModelChoiceField(queryset=Membership.objects.none(), required=False)
    models = forms.CharField(
        required=False,
        max_length=4000,
        label="Models",
        help_text="Comma-separated model names; empty: every model.",
    )
    field_order = ["scope", "agent", "api_key", "member", "models", "budget_period"]

    def __init__(self, *args, tenant, **kwargs):
        kwargs.setdefault("auto_id", "scoped_%s")  # beside the tenant budget's form
        super().__init__(*args, **kwargs)
        self.fields["budget_limit_usd"].required = True
        self.fields["budget_limit_usd"].help_text = ""
        owners = (
            ("agent", Agent.objects.filter(tenant=tenant, is_active=True), lambda a: a.name),
            (
                "api_key",
                ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True).select_related(
                    "agent"
                ),
                lambda k: f"{k.prefix} ({k.agent.name}{', ' + k.name if k.name else ''})",
            ),
            (
                "member",
                Membership.objects.filter(tenant=tenant, is_active=True).select_related("user"),
                lambda m: m.user.get_username(),
            ),
        )
        for name, queryset, label in owners:
            self.fields[name].queryset = queryset
            self.fields[name].label_from_instance = label

    def clean(self):
        data = super().clean()
        scope = data.get("scope")
        if scope in ("agent", "api_key", "member") and not data.get(scope):
            self.add_error(scope, f"Choose the {self.fields[scope].label or scope}.")
        data["model_names"] = [m.strip() for m in data.get("models", "").split(",") if m.strip()]
        return data

    def owners(self) -> dict:
        """The budget services' scope arguments."""
        scope = self.cleaned_data["scope"]
        return {scope: self.cleaned_data[scope]} if scope != "tenant" else {}


class KeyForm(PortalForm):
    agent = forms.ModelChoiceField(queryset=Agent.objects.none(), empty_label=None)
    name = forms.CharField(max_length=100, required=False)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, initial=[Scope.INFERENCE], widget=forms.CheckboxSelectMultiple
    )
    expires_in_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=3650,
        label="Expires in (days)",
        help_text="Empty: never expires.",
    )

    def __init__(self, *args, agents, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["agent"].queryset = agents
        self.fields["agent"].label_from_instance = lambda agent: agent.name


class RotateForm(PortalForm):
    grace_seconds = forms.TypedChoiceField(
        choices=GRACE_CHOICES, coerce=int, initial=3600, label="The old key keeps working for"
    )


class MemberAddForm(PortalForm):
    username = forms.CharField(max_length=254, label="Username or email")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(PortalForm):
    role = forms.ChoiceField(choices=Role.choices)


class RequestLogPolicyForm(PortalForm):
    enabled = forms.BooleanField(required=False, label="Keep the prompt and answer of requests")
    retention_days = forms.IntegerField(
        min_value=1, max_value=365, initial=7, label="Keep them for (days)"
    )
    redact_emails = forms.BooleanField(required=False, label="Redact email addresses")
    redact_numbers = forms.BooleanField(
        required=False, label="Redact numbers (six or more digits: phones, cards, accounts)"
    )
