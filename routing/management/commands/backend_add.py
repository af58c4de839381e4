"""Register (or change) a backend and the models it serves, from the command line:

  python manage.py backend_add openrouter --kind openrouter --base-url https://openrouter.ai/api \\
      --credential-ref env:OPENROUTER_API_KEY \\
      --model gpt-4o-mini=openai/gpt-4o-mini:15000000,60000000,7500000

A --model is NAME[=UPSTREAM][:IN,OUT,CACHED] with prices in micro-cents per million tokens.
A plain secret can be given with --credential-stdin (read from standard input, stored
encrypted; never pass secrets as arguments, they land in shell history and `ps`).
"""

import argparse
import sys

from django.core.management.base import BaseCommand, CommandError

from routing.backend_store import backend_model_set, backend_register
from routing.models import BackendKind
from tenants.errors import InvalidRequest


def _model(value: str) -> dict:
    name, _, prices = value.partition(":")
    name, _, upstream = name.partition("=")
    row: dict[str, str | int] = {"model": name, "upstream_name": upstream}
    if prices:
        parts = [int(p) for p in prices.split(",")]
        keys = ["price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok"]
        row.update(zip(keys, parts, strict=False))
    return row


class Command(BaseCommand):
    help = (
        "Add or change a backend (local, fairlane, openai_compatible, openrouter, openai, "
        "anthropic)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--kind", required=True, choices=BackendKind.values)
        parser.add_argument("--base-url", default="")
        parser.add_argument("--credential-ref", default="")
        parser.add_argument("--credential-stdin", action="store_true")
        parser.add_argument("--model", action="append", default=[], type=_model)
        parser.add_argument("--context-length", type=int)
        parser.add_argument("--max-concurrency", type=int)
        parser.add_argument("--lease-seconds", type=int)
        parser.add_argument("--queue-depth", type=int)
        parser.add_argument("--zone")
        parser.add_argument("--energy-mj-per-token", type=int)
        parser.add_argument("--carbon-g-per-kwh", type=int)
        parser.add_argument("--hidden-states", action="store_true", default=None)
        parser.add_argument("--timeout-seconds", type=float)
        for feature in ("tools", "json-schema", "vision"):  # unset: the kind's default
            parser.add_argument(f"--supports-{feature}", action=argparse.BooleanOptionalAction)

    def handle(self, *args, name, kind, credential_stdin, model, **options):
        fields = {
            k: v
            for k, v in options.items()
            if k
            in {
                "base_url",
                "credential_ref",
                "context_length",
                "max_concurrency",
                "lease_seconds",
                "queue_depth",
                "zone",
                "energy_mj_per_token",
                "carbon_g_per_kwh",
                "hidden_states",
                "timeout_seconds",
                "supports_tools",
                "supports_json_schema",
                "supports_vision",
            }
            and v not in (None, "")
        }
        credential = sys.stdin.readline().strip() if credential_stdin else None
        try:
            backend = backend_register(name=name, kind=kind, credential=credential, **fields)
            for row in model:
                backend_model_set(backend=backend, **row)
        except InvalidRequest as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"backend {backend.name} ({backend.kind}) serves "
            f"{sorted(backend.models.values_list('model', flat=True))}"
        )
