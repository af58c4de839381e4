"""Create an Ed25519 key pair for signing models: KEYFILE (private, PEM, readable by you only)
and KEYFILE.pub (`ed25519:<base64>`). Prints the key id; --trust adds the public key to the
registry's trusted keys."""

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand, CommandError

from tenants.services.audit import audit_change
from workers.artifacts.keys import key_id, private_write, public_text
from workers.models import TrustedKey


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("keyfile")
        parser.add_argument("--trust", metavar="NAME", help="trust it here under this name")

    def handle(self, *args, keyfile: str, trust: str | None, **options):
        key = Ed25519PrivateKey.generate()
        try:
            private_write(keyfile, key)
        except FileExistsError:
            raise CommandError(f"{keyfile} exists; not overwriting a key") from None
        public = key.public_key()
        Path(keyfile + ".pub").write_text(public_text(public) + "\n")
        if trust:
            row = TrustedKey(name=trust, public_key=public_text(public))
            row.full_clean()
            row.save()
            audit_change("trustedkey.add", row)
        self.stdout.write(
            f"wrote {keyfile} (private: keep it secret) and {keyfile}.pub\n"
            f"key id {key_id(public)}\npublic key {public_text(public)}"
            + (f"\ntrusted here as {trust!r}" if trust else "")
        )
