"""Sign a model directory: write its manifest (every file's path, sha256 and size, and the
model's name, version, source and license, as an in-toto Statement in canonical JSON) and a
detached Ed25519 signature over it. Sign after the directory is final: any later change to it
(a byte, a file added, removed or renamed) makes workers refuse it."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from workers.artifacts.keys import KeyProblem, private_load
from workers.artifacts.signing import model_sign
from workers.artifacts.trust import dev_key_ensure
from workers.artifacts.verify import model_verify

STRUCTURE = {"symlink", "special_file", "pickle", "not_safetensors", "not_found"}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("directory")
        keys = parser.add_mutually_exclusive_group(required=True)
        keys.add_argument("--key", metavar="KEYFILE", help="Ed25519 private key (PEM)")
        keys.add_argument(
            "--dev-key",
            action="store_true",
            help="the local development key (FAIRLANE_DEV_SIGNING_KEY)",
        )
        parser.add_argument("--name", help="model name (default: the directory's name)")
        parser.add_argument(
            "--model-version",
            dest="model_version",
            default="1",
            help="the version this signature vouches for (default 1)",
        )
        parser.add_argument("--source", help="where the weights came from (default: the path)")
        parser.add_argument(
            "--license",
            "--licence",
            dest="license",
            default="NOASSERTION",
            help="SPDX licence id, e.g. apache-2.0 (default NOASSERTION)",
        )

    def handle(
        self, *args, directory, key, dev_key, name, model_version, source, license, **options
    ):
        root = Path(directory).resolve()
        found = [p for p in model_verify(root, {}, exhaustive=True).problems if p.code in STRUCTURE]
        if found:
            raise CommandError(
                "not signing; workers would refuse this directory anyway:\n  "
                + "\n  ".join(map(str, found))
            )
        try:
            private = private_load(key) if key else dev_key_ensure()
        except KeyProblem as exc:
            raise CommandError(str(exc)) from None
        if private is None:
            raise CommandError("no development key: FAIRLANE_DEV_SIGNING_KEY is empty")
        digest, signer = model_sign(
            root,
            private,
            name=name or root.name,
            version=model_version,
            source=source or str(root),
            license=license,
        )
        self.stdout.write(f"signed {root}\n  manifest {digest}\n  signer   {signer}")
