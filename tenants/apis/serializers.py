"""Request and response shapes of the management API. Input is strict: unknown fields, wrong
JSON types (a string for a number, 1 for true) and out-of-range values are 400s."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.models import (
    MAX_MICROCENTS,
    Budget,
    Lane,
    Period,
    Role,
    Scope,
    SoftAction,
    Tenant,
    name_validator,
    timezone_names,
)

# IANA time zones, as the schema's enum: a client (and schemathesis) knows which are valid.
TIMEZONES = sorted(timezone_names())


class _TextOnly:
    """JSON strings only: DRF would otherwise turn 123 into "123"."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(_TextOnly, serializers.CharField):
    pass


class StrictSlugField(_TextOnly, serializers.SlugField):
    pass


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Rejects fields it does not know instead of silently ignoring them."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        writable = {name for name, field in self.fields.items() if not field.read_only}
        unknown = sorted(set(data) - writable)
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def _microcents_field(**kwargs) -> StrictIntegerField:
    return StrictIntegerField(min_value=0, max_value=MAX_MICROCENTS, **kwargs)


# --- input ---------------------------------------------------------------------------------


class TenantCreateIn(StrictSerializer):
    name = StrictCharField(max_length=200)
    slug = StrictSlugField(max_length=63)
    timezone = StrictChoiceField(choices=TIMEZONES, default="UTC")
    default_lane = StrictChoiceField(choices=Lane.choices, default=Lane.STANDARD)


class TenantUpdateIn(StrictSerializer):
    name = StrictCharField(max_length=200, required=False)
    timezone = StrictChoiceField(choices=TIMEZONES, required=False)
    default_lane = StrictChoiceField(choices=Lane.choices, required=False)
    departed_member_keys = StrictChoiceField(
        choices=Tenant.DepartedMemberKeys.choices, required=False
    )
    sso_only = StrictBooleanField(required=False)


class MemberAddIn(StrictSerializer):
    username = StrictCharField(max_length=150)
    role = StrictChoiceField(choices=Role.choices, default=Role.MEMBER)


class MemberUpdateIn(StrictSerializer):
    role = StrictChoiceField(choices=Role.choices)


# The limits' columns are PostgreSQL integers.
MAX_LIMIT = 2**31 - 1


class RateLimitsIn(StrictSerializer):
    rpm_limit = StrictIntegerField(min_value=1, max_value=10**9, required=False, allow_null=True)
    tpm_limit = StrictIntegerField(
        min_value=1, max_value=MAX_LIMIT, required=False, allow_null=True
    )
    concurrency_limit = StrictIntegerField(
        min_value=1, max_value=10**6, required=False, allow_null=True
    )


class AgentCreateIn(RateLimitsIn):
    name = StrictCharField(max_length=100, validators=[name_validator])
    description = StrictCharField(max_length=500, required=False, allow_blank=True, default="")
    allowed_models = serializers.ListField(
        child=StrictCharField(max_length=200, validators=[name_validator]),
        required=False,
        default=list,
        max_length=200,
    )
    lane = StrictChoiceField(
        choices=[("", "tenant default"), *Lane.choices],
        required=False,
        default="",
        allow_blank=True,
    )


class AgentUpdateIn(RateLimitsIn):
    name = StrictCharField(max_length=100, required=False, validators=[name_validator])
    description = StrictCharField(max_length=500, required=False, allow_blank=True)
    allowed_models = serializers.ListField(
        child=StrictCharField(max_length=200, validators=[name_validator]),
        required=False,
        max_length=200,
    )
    lane = StrictChoiceField(
        choices=[("", "tenant default"), *Lane.choices], required=False, allow_blank=True
    )
    is_active = StrictBooleanField(required=False)


class KeyCreateIn(RateLimitsIn):
    agent = serializers.UUIDField()
    name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
    scopes = serializers.ListField(
        child=StrictChoiceField(choices=Scope.choices),
        required=False,
        allow_empty=False,
        min_length=1,
        max_length=len(Scope.choices),
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class KeyRotateIn(StrictSerializer):
    grace_seconds = StrictIntegerField(min_value=0, max_value=30 * 24 * 3600, default=3600)


class BudgetSoftIn(StrictSerializer):
    """A budget's soft level: at `soft_limit_microcents` (≤ the limit; null: none) spent and
    reserved, `soft_action` applies (throttle: `soft_rpm` requests per minute)."""

    soft_limit_microcents = _microcents_field(required=False, allow_null=True)
    soft_action = StrictChoiceField(choices=SoftAction.choices, required=False)
    soft_rpm = StrictIntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True)


class BudgetCreateIn(BudgetSoftIn):
    """One scope at most (agent, api_key or member; none: the whole tenant), for `models` only
    when given (empty: every model)."""

    agent = serializers.UUIDField(required=False, allow_null=True, default=None)
    api_key = serializers.UUIDField(required=False, allow_null=True, default=None)
    member = StrictIntegerField(
        required=False, allow_null=True, default=None, help_text="A membership id (/members/)."
    )
    models = serializers.ListField(
        child=StrictCharField(max_length=200), required=False, default=list, max_length=50
    )
    period = StrictChoiceField(choices=Period.choices, default=Period.DAILY)
    limit_microcents = _microcents_field()


class BudgetUpdateIn(BudgetSoftIn):
    period = StrictChoiceField(choices=Period.choices, required=False)
    limit_microcents = _microcents_field(required=False)


class UsageQueryIn(serializers.Serializer):
    """Query string of the usage endpoints (limit/offset are the paginator's)."""

    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    agent = serializers.UUIDField(required=False)
    api_key = serializers.UUIDField(required=False)
    member = serializers.IntegerField(required=False, min_value=1)
    model = StrictCharField(required=False, max_length=200)
    group_by = StrictCharField(required=False, max_length=100)


# --- output --------------------------------------------------------------------------------


class RateLimitsOut(serializers.Serializer):
    rpm_limit = serializers.IntegerField(allow_null=True)
    tpm_limit = serializers.IntegerField(allow_null=True)
    concurrency_limit = serializers.IntegerField(allow_null=True)


class TenantOut(RateLimitsOut):
    slug = serializers.CharField()
    name = serializers.CharField()
    status = serializers.CharField()
    timezone = serializers.CharField()
    weight = serializers.IntegerField()
    default_lane = serializers.CharField()
    departed_member_keys = serializers.CharField()
    sso_only = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    role = serializers.SerializerMethodField()

    def get_role(self, tenant) -> str | None:
        return self.context.get("roles", {}).get(tenant.pk)


class MemberOut(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField(source="user.username")
    email = serializers.CharField(source="user.email")
    role = serializers.CharField()
    created_at = serializers.DateTimeField()


class KeyFatesOut(serializers.Serializer):
    revoked = serializers.ListField(
        child=serializers.CharField(), help_text="Prefixes of the keys that would be revoked."
    )
    handed_over = serializers.ListField(
        child=serializers.CharField(),
        help_text="Prefixes of the inference keys that would stay with their agent.",
    )


class MemberDetailOut(MemberOut):
    keys_on_removal = serializers.SerializerMethodField(
        help_text="What removing this member now would do to the keys they made."
    )

    @extend_schema_field(KeyFatesOut)
    def get_keys_on_removal(self, membership) -> dict:
        fates = self.context["fates"]
        return {
            "revoked": [k.prefix for k in fates.revoked],
            "handed_over": [k.prefix for k in fates.handed_over],
        }


class AgentOut(RateLimitsOut):
    id = serializers.UUIDField()
    name = serializers.CharField()
    description = serializers.CharField()
    allowed_models = serializers.ListField(child=serializers.CharField())
    lane = serializers.CharField()
    effective_lane = serializers.CharField()
    is_active = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class KeyOut(RateLimitsOut):
    id = serializers.UUIDField()
    prefix = serializers.CharField()
    name = serializers.CharField()
    agent = serializers.UUIDField(source="agent_id")
    agent_name = serializers.CharField(source="agent.name")
    scopes = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    rotated_from = serializers.UUIDField(source="rotated_from_id", allow_null=True)
    handed_over_at = serializers.DateTimeField(
        allow_null=True, help_text="When its maker left and it stayed with its agent."
    )


class KeyCreatedOut(KeyOut):
    key = serializers.CharField(help_text="The API key. Shown once: store it now.")


class WindowOut(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    limit_microcents = serializers.IntegerField()
    spent_microcents = serializers.IntegerField()
    reserved_microcents = serializers.IntegerField()
    remaining_microcents = serializers.IntegerField()


class BudgetOut(serializers.Serializer):
    id = serializers.UUIDField()
    scope = serializers.ChoiceField(choices=Budget.Scope.choices)
    agent = serializers.UUIDField(source="agent_id", allow_null=True)
    agent_name = serializers.CharField(source="agent.name", default=None, allow_null=True)
    api_key = serializers.UUIDField(source="api_key_id", allow_null=True)
    api_key_prefix = serializers.CharField(source="api_key.prefix", default=None, allow_null=True)
    member = serializers.IntegerField(source="member_id", allow_null=True)
    member_username = serializers.CharField(
        source="member.user.username", default=None, allow_null=True
    )
    models = serializers.ListField(child=serializers.CharField(), source="model_names")
    period = serializers.CharField()
    limit_microcents = serializers.IntegerField()
    soft_limit_microcents = serializers.IntegerField(allow_null=True)
    soft_action = serializers.CharField()
    soft_rpm = serializers.IntegerField(allow_null=True)
    window = WindowOut(source="current_window")


class UsageOut(serializers.Serializer):
    request_id = serializers.CharField()
    agent = serializers.UUIDField(source="agent_id")
    agent_name = serializers.CharField(source="agent.name")
    api_key_prefix = serializers.CharField(source="api_key.prefix", default=None, allow_null=True)
    backend = serializers.CharField()
    model = serializers.CharField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    cost_microcents = serializers.IntegerField()
    unbilled_microcents = serializers.IntegerField(
        help_text="What the request cost beyond the room its budgets had left (normally 0)."
    )
    latency_ms = serializers.IntegerField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()


class UsageSummaryOut(serializers.Serializer):
    """One group's totals; the fields of the dimensions not grouped by are null."""

    agent_name = serializers.CharField(source="agent__name", default=None, allow_null=True)
    api_key_prefix = serializers.SerializerMethodField()
    member_username = serializers.CharField(
        source="api_key__created_by__username", default=None, allow_null=True
    )
    model = serializers.CharField(default=None, allow_null=True)
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    cost_microcents = serializers.IntegerField()

    def get_api_key_prefix(self, row) -> str | None:
        key_id = row.get("api_key__key_id")
        return f"fl-{key_id}" if key_id else None


class UsageSummaryListOut(serializers.Serializer):
    results = UsageSummaryOut(many=True)
