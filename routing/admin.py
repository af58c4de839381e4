"""The operators' admin over the backend registry. A credential is typed into a write-only
field and stored encrypted; the page shows only whether one is set."""

from django import forms
from django.contrib import admin

from routing.credentials import credential_encrypt, credential_ref_check
from routing.models import AgentRouting, Backend, BackendModel
from tenants.admin_audit import AuditedAdmin
from tenants.errors import InvalidRequest


class BackendForm(forms.ModelForm):
    base_url = forms.URLField(required=False, assume_scheme="https")
    credential = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="The provider's API key: stored encrypted, never shown again. Leave empty "
        "to keep the current one.",
    )
    clear_credential = forms.BooleanField(required=False)

    class Meta:
        model = Backend
        # Every column but the secret's ciphertext and the probe's raw samples: a new column
        # shows here without a change.
        exclude = ["credential_encrypted", "probe_samples"]  # noqa: DJ006

    def clean_credential_ref(self):
        value = self.cleaned_data["credential_ref"]
        try:
            credential_ref_check(value)
        except InvalidRequest as exc:
            raise forms.ValidationError(exc.message) from None
        return value

    def save(self, commit=True):
        backend = super().save(commit=False)
        if self.cleaned_data.get("clear_credential"):
            backend.credential_encrypted = ""
        if self.cleaned_data.get("credential"):
            backend.credential_encrypted = credential_encrypt(self.cleaned_data["credential"])
        if commit:
            backend.save()
        return backend


class BackendModelInline(admin.TabularInline):
    model = BackendModel
    extra = 0


@admin.register(Backend)
class BackendAdmin(AuditedAdmin):
    form = BackendForm
    list_display = [
        "name",
        "kind",
        "base_url",
        "health",
        "probe_p95_ms",
        "probe_error_rate",
        "is_enabled",
        "has_credential",
    ]
    list_filter = ["kind", "health", "is_enabled"]
    search_fields = ["name", "base_url"]
    readonly_fields = [
        "health",
        "health_checked_at",
        "health_ok_at",
        "health_detail",
        "probe_p50_ms",
        "probe_p95_ms",
        "probe_error_rate",
        "last_error",
        "last_error_at",
    ]
    inlines = [BackendModelInline]

    @admin.display(boolean=True)
    def has_credential(self, obj):
        return obj.has_credential


@admin.register(AgentRouting)
class AgentRoutingAdmin(AuditedAdmin):
    list_display = ["agent", "policy", "chain", "cascade"]
    list_select_related = ["agent__tenant"]
    autocomplete_fields = ["agent"]
