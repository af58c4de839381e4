"""Verify the audit log: every chain's hashes and links, its end against its head, and every
signed checkpoint (by a trusted key) against the records it covers. Names the first bad
record of each chain (edited, deleted, inserted, reordered, rewritten) and exits 1; prints
"audit log intact" and exits 0 when nothing is wrong."""

from django.core.management.base import BaseCommand, CommandError

from tenants.models import AuditCheckpoint, AuditRecord
from tenants.services.audit import audit_verify
from workers.artifacts.audit_signing import audit_checkpoint_valid


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument(
            "--chain",
            action="append",
            default=None,
            help="only this chain (platform, or tenant:<id>); repeatable",
        )

    def handle(self, *args, chain, **options):
        problems = audit_verify(signature_valid=audit_checkpoint_valid, chains=chain)
        for problem in problems:
            self.stderr.write(str(problem))
        if problems:
            raise CommandError(
                f"audit log: {len(problems)} problem(s); the first bad record is named above"
            )
        self.stdout.write(
            f"audit log intact: {AuditRecord.objects.count()} records, "
            f"{AuditCheckpoint.objects.count()} signed checkpoints"
        )
