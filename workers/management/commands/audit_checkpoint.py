"""Sign the audit log's chain heads now with the platform's Ed25519 key (the beat does it every
FAIRLANE_AUDIT_CHECKPOINT_SECONDS; in the embedded mode run this from cron)."""

from django.core.management.base import BaseCommand, CommandError

from workers.artifacts.audit_signing import audit_checkpoint_sign


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args, **options):
        checkpoint = audit_checkpoint_sign()
        if checkpoint is None:
            raise CommandError("no signing key: set FAIRLANE_AUDIT_SIGNING_KEY")
        self.stdout.write(
            f"checkpoint {checkpoint.pk} signed by {checkpoint.key_id}: {checkpoint.payload}"
        )
