"""Train the byte-level preset pair on the standard library's sources (offline, seeded): the
`draft`, then the `small` target grown from it. Cached under FAIRLANE_MODEL_DIR as
<preset>-py-seed<seed> (a pair trained with the same recipe is reused) and signed by the local
development key, like the presets, so a worker loads them under FAIRLANE_MODEL_SIGNATURES."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from workers.artifacts.signing import model_sign
from workers.artifacts.trust import dev_key_ensure
from workers.engine.training.__main__ import main

TRAINED_LICENSE = "NOASSERTION"  # trained here on the Python standard library's sources (PSF)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--threads", type=int, default=2)
        parser.add_argument(
            "--max-minutes",
            type=float,
            default=15.0,
            help="each model stops training after this long (and says so)",
        )

    def handle(self, *args, seed: int, threads: int, max_minutes: float, **options):
        result = main(
            [
                "--models-dir",
                str(settings.FAIRLANE_MODEL_DIR),
                "--seed",
                str(seed),
                "--threads",
                str(threads),
                "--max-minutes",
                str(max_minutes),
            ]
        )
        key = dev_key_ensure()
        for preset, trained in result.items():
            path = Path(trained["path"])
            if key is not None:
                digest, signer = model_sign(
                    path,
                    key,
                    name=f"{preset}-py",
                    version=f"seed{seed}",
                    source="preset_train (Python standard library)",
                    license=TRAINED_LICENSE,
                )
                self.stdout.write(f"signed {path} ({digest}, key {signer})")
            self.stdout.write(
                f"{preset}: {path}  train loss {trained.get('train_loss')}, "
                f"held-out perplexity {trained.get('heldout_ppl')} per byte"
            )
