"""Trust a public key to sign models (the registry's list; FAIRLANE_TRUSTED_KEYS is the
other), list the trusted keys, or stop trusting one."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenants.services.audit import audit_change, snapshot
from workers.artifacts.keys import KeyProblem, public_load, public_text
from workers.artifacts.trust import trusted_keys
from workers.models import TrustedKey


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="a name for the key")
        parser.add_argument("key", nargs="?", help="ed25519:<base64>, or a PEM/.pub file")
        parser.add_argument("--list", action="store_true", help="every key trusted here")
        parser.add_argument("--revoke", metavar="KEY_ID", help="stop trusting a registry key")

    def handle(self, *args, name, key, list: bool, revoke: str | None, **options):
        if list:
            for kid in sorted(trusted_keys()):
                row = TrustedKey.objects.filter(key_id=kid).first()
                self.stdout.write(f"{kid}  {row.name if row else '(settings or dev key)'}")
            return
        if revoke:
            row = TrustedKey.objects.filter(key_id=revoke).first()
            if row is None or not TrustedKey.objects.filter(key_id=revoke).update(is_active=False):
                raise CommandError(f"no registry key {revoke}")
            audit_change(
                "trustedkey.revoke", TrustedKey.objects.get(pk=row.pk), before=snapshot(row)
            )
            self.stdout.write(f"no longer trusted: {revoke}")
            return
        if not (name and key):
            raise CommandError("give NAME and KEY, or --list, or --revoke KEY_ID")
        try:
            text = public_text(public_load(key))
        except KeyProblem as exc:
            raise CommandError(str(exc)) from None
        row = TrustedKey.objects.filter(public_key=text).first() or TrustedKey(public_key=text)
        before = snapshot(row) if row.pk else None
        row.name, row.is_active = name, True
        try:
            row.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        row.save()
        audit_change("trustedkey.add", row, before=before)
        self.stdout.write(f"trusted: {row.key_id} ({name})")
