import functools

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class TenantsConfig(AppConfig):
    default = True  # apps.py also holds the admin's config
    name = "tenants"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        from tenants import cache
        from tenants.models import Agent, ApiKey, Budget, BudgetWindow, Tenant

        # Windows too: a cached window row that was deleted must not be held against (their
        # counters change by UPDATE, which sends no signal and needs none: never cached).
        cache.connect(ApiKey, Tenant, Agent, Budget, BudgetWindow)
        # A person's keys follow them out: their account deactivated (the admin, SCIM) or
        # deleted.
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save, pre_delete

        from tenants.services.member_keys import user_changed, user_deleting

        post_save.connect(user_changed, sender=get_user_model(), dispatch_uid="keys-user")
        pre_delete.connect(user_deleting, sender=get_user_model(), dispatch_uid="keys-user-del")
        # A session remembers when it began and whether it came through single sign-on.
        from django.contrib.auth.signals import user_logged_in

        from tenants.services.sessions import session_started

        user_logged_in.connect(session_started, dispatch_uid="session-started")
        _commands_audited()


def _commands_audited() -> None:
    """Every management command runs in an audit context of its own (the command, and the
    operating-system user and host that ran it), whether started from manage.py or by
    call_command: the records its services write name it as their actor."""
    from django.core.management.base import BaseCommand

    if hasattr(BaseCommand.execute, "__wrapped__"):  # done already (a second registry)
        return
    from tenants.services.audit import audit_context, command_context

    execute = BaseCommand.execute

    @functools.wraps(execute)
    def audited_execute(self, *args, **options):
        name = type(self).__module__.rsplit(".", 1)[-1]
        with audit_context(command_context(name)):
            return execute(self, *args, **options)

    BaseCommand.execute = audited_execute  # type: ignore[method-assign]  # Django has no hook


class AdminConfig(admin_apps.AdminConfig):
    """The Django admin on Fairlane's site: its sign-in throttled like the portal's."""

    default = False  # tenants' own config is this module's default
    default_site = "tenants.signin.FairlaneAdminSite"
