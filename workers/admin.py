from django import forms
from django.contrib import admin

from tenants.admin_audit import AuditedAdmin
from tenants.errors import InvalidRequest
from workers.artifacts.load import artifact_provenance
from workers.models import ModelVerification, ModelVersion, ServedModel, TrustedKey
from workers.serving.catalog import model_dir, model_source_check, versions_split


class ServedModelForm(forms.ModelForm):
    """Adding a model here checks it as model_register does and records its provenance."""

    class Meta:
        model = ServedModel
        exclude: list[str] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for field in ("min_replicas", "max_replicas"):  # left out: the model's default
            self.fields[field].required = False

    def clean_min_replicas(self) -> int:
        return (
            self.cleaned_data.get("min_replicas")
            or ServedModel._meta.get_field("min_replicas").default
        )

    def clean_max_replicas(self) -> int:
        return (
            self.cleaned_data.get("max_replicas")
            or ServedModel._meta.get_field("max_replicas").default
        )

    def clean(self):
        data = super().clean()
        source = data.get("source")
        if source and not self.has_error("source"):
            try:
                model_source_check(source)
                self.provenance = artifact_provenance(path=model_dir(source))
            except InvalidRequest as exc:
                self.add_error("source", exc.message)
        return data


class ModelVerificationInline(admin.TabularInline):
    """What each worker found when it last checked the model before loading it."""

    model = ModelVerification
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "worker",
        "status",
        "reasons",
        "manifest_digest",
        "signer",
        "checked_at",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class ModelVersionInline(admin.TabularInline):
    """The model's versions; they change through model_register --version, model_promote and
    model_rollback, which keep one primary and the model's source pointing at it."""

    model = ModelVersion
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "label",
        "state",
        "weight",
        "source",
        "manifest_digest",
        "created_at",
        "primary_until",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ServedModel)
class ServedModelAdmin(AuditedAdmin):
    list_display = [
        "name",
        "source",
        "runtime",
        "is_enabled",
        "verification",
        "versions_live",
        "min_replicas",
        "max_replicas",
        "license",
        "price_input_per_mtok",
        "price_output_per_mtok",
        "price_cached_per_mtok",
        "created_at",
    ]
    list_filter = ["is_enabled", "runtime", "verifications__status"]
    search_fields = ["name", "source"]
    readonly_fields = ["manifest_digest", "signer", "origin", "license"]
    inlines = [ModelVersionInline, ModelVerificationInline]
    form = ServedModelForm

    def save_model(self, request, obj, form, change) -> None:
        for field, value in getattr(form, "provenance", {}).items():
            setattr(obj, field, value)
        super().save_model(request, obj, form, change)

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else [ModelVerificationInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("verifications", "versions")

    @admin.display(description="versions")
    def versions_live(self, obj: ServedModel) -> str:
        """The versions taking traffic and their shares, e.g. "v2 95%, v3 5%"."""
        return ", ".join(f"{label} {weight}%" for label, _, _, weight in versions_split(obj)) or "-"

    @admin.display(description="verification")
    def verification(self, obj: ServedModel) -> str:
        """Refused anywhere wins; else the latest check."""
        checks = list(obj.verifications.all())
        if not checks:
            return "not loaded yet"
        refused = [c for c in checks if c.status == ModelVerification.Status.REFUSED]
        latest = refused[0] if refused else checks[0]
        return f"{latest.status} ({latest.worker})"


@admin.register(ModelVerification)
class ModelVerificationAdmin(admin.ModelAdmin):
    list_display = ["model", "worker", "status", "checked_at", "signer"]
    list_filter = ["status"]
    search_fields = ["model__name", "worker", "reasons"]
    readonly_fields = [
        "model",
        "worker",
        "status",
        "reasons",
        "manifest_digest",
        "signer",
        "checked_at",
    ]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(TrustedKey)
class TrustedKeyAdmin(AuditedAdmin):
    list_display = ["name", "key_id", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "key_id"]
    readonly_fields = ["key_id"]
