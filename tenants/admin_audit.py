"""The Django admin's changes in the audit log: every ModelAdmin of the platform derives from
`AuditedAdmin`, whose hooks record each save and delete (its inlines' too) with the state
before and after, in the same transaction as the change. The actor is the signed-in staff
user (tenants.middleware sets the context for /admin/)."""

from __future__ import annotations

from django.contrib import admin
from django.db import transaction

from tenants.services.audit import audit_change, snapshot


def _stored(obj):
    """The object as the database has it now (the form has already changed `obj`)."""
    if obj.pk is None:
        return None
    return snapshot(type(obj)._default_manager.filter(pk=obj.pk).first())


def _action(obj, verb: str) -> str:
    return f"{obj._meta.model_name}.{verb}"


class AuditedAdmin(admin.ModelAdmin):
    def save_model(self, request, obj, form, change):
        before = _stored(obj) if change else None
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if before != snapshot(obj):
                audit_change(_action(obj, "update" if change else "create"), obj, before=before)

    def delete_model(self, request, obj):
        with transaction.atomic():
            audit_change(_action(obj, "delete"), obj, before=snapshot(obj), deleted=True)
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for obj in queryset:
                audit_change(_action(obj, "delete"), obj, before=snapshot(obj), deleted=True)
            super().delete_queryset(request, queryset)

    def save_formset(self, request, form, formset, change):
        stored = {id(f.instance): _stored(f.instance) for f in formset.forms}
        deleted = [
            (f.instance, stored[id(f.instance)])
            for f in formset.deleted_forms
            if f.instance.pk is not None
        ]
        with transaction.atomic():
            for obj, before in deleted:  # before their rows (and ids) are gone
                audit_change(_action(obj, "delete"), obj, before=before, deleted=True)
            super().save_formset(request, form, formset, change)
            for obj in formset.new_objects:
                audit_change(_action(obj, "create"), obj)
            for obj, _fields in formset.changed_objects:
                audit_change(_action(obj, "update"), obj, before=stored.get(id(obj)))
