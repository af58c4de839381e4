"""Register (or update) a served model: a seeded preset or a local Hugging Face directory. Its
signed manifest is checked as a worker would, and its digest, signer, origin and license are
recorded."""

from django.core.management.base import BaseCommand, CommandError

from tenants.errors import InvalidRequest
from workers.registry import model_register


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", help="the id clients send as `model`")
        parser.add_argument("source", help="preset:<name>[@seed] or an absolute directory path")
        parser.add_argument("--description", default="")
        for kind in ("input", "output", "cached"):
            parser.add_argument(f"--price-{kind}", type=int, default=0,
                                help=f"{kind} tokens: micro-cents per million (10_000_000 = $0.10)")

    def handle(self, *args, name, source, description, price_input, price_output, price_cached,
               **options):
        try:
            row = model_register(name=name, source=source, description=description,
                                 price_input_per_mtok=price_input,
                                 price_output_per_mtok=price_output,
                                 price_cached_per_mtok=price_cached)
        except InvalidRequest as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"registered {row.name} -> {row.source}")
        if row.manifest_digest:
            self.stdout.write(f"  manifest {row.manifest_digest}\n  signer   "
                              f"{row.signer or '(unsigned)'}\n  origin   {row.origin}\n"
                              f"  license  {row.license}")
