"""Check a model directory as a worker does before loading it, and say exactly what is wrong:
the signature (by a trusted key?), every file's hash, extra or missing files, links, pickles.
Exits non-zero when a worker would refuse it under the policy."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers.artifacts.load import artifact_check


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("directory")
        parser.add_argument(
            "--policy", choices=["require", "warn"], help="default: FAIRLANE_MODEL_SIGNATURES"
        )

    def handle(self, *args, directory, policy, **options):
        policy = policy or settings.FAIRLANE_MODEL_SIGNATURES
        result, refusals = artifact_check(
            path=Path(directory).resolve(), policy=policy, exhaustive=True
        )
        lines = [
            f"{directory}: {result.files} files; signature: {result.trust}"
            + (f" by {result.signer}" if result.signer else ""),
            f"  manifest {result.digest or '(none)'}",
        ]
        if result.predicate:
            lines.append(
                "  "
                + ", ".join(
                    f"{k} {result.predicate.get(k)!r}"
                    for k in ("name", "version", "source", "license")
                )
            )
        self.stdout.write("\n".join(lines))
        if refusals:
            raise CommandError(
                f"refused under policy {policy!r}:\n  " + "\n  ".join(map(str, refusals))
            )
        self.stdout.write(f"OK under policy {policy!r}")
