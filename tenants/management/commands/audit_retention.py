"""Delete audit records older than FAIRLANE_AUDIT_RETENTION_DAYS (or --days), as the retention
role: on PostgreSQL through FAIRLANE_AUDIT_RETENTION_DATABASE_URL, a login role that is (or is
granted) fairlane_audit_retention; the application's own role is refused by the table's
trigger. Each chain keeps verifying from its first remaining record."""

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from tenants.services.audit.retention import audit_prune_postgres, audit_prune_sqlite


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None)

    def handle(self, *args, days, **options):
        days = days if days is not None else settings.FAIRLANE_AUDIT_RETENTION_DAYS
        if not days or days < 1:
            self.stdout.write("retention is off (FAIRLANE_AUDIT_RETENTION_DAYS=0): kept all")
            return
        cutoff = timezone.now() - timedelta(days=days)
        if connection.vendor == "sqlite":
            deleted = audit_prune_sqlite(cutoff=cutoff)
        elif settings.FAIRLANE_AUDIT_RETENTION_DATABASE_URL:
            deleted = audit_prune_postgres(
                database_url=settings.FAIRLANE_AUDIT_RETENTION_DATABASE_URL, cutoff=cutoff
            )
        else:
            raise CommandError(
                "set FAIRLANE_AUDIT_RETENTION_DATABASE_URL to the retention "
                "role's connection (docs/security.md, Audit log)"
            )
        self.stdout.write(f"deleted {deleted} audit records older than {cutoff:%Y-%m-%d %H:%M}")
