"""Register (or update) a served model: a seeded preset or a local Hugging Face directory. Its
signed manifest is checked as a worker would, and its digest, signer, origin and license are
recorded. With --version the source is a version of the model: it serves every request from
now on (the workers load it and drain the old one), or with --canary PERCENT that share of
them."""

from django.core.management.base import BaseCommand, CommandError

from tenants.errors import InvalidRequest
from workers.serving.catalog import ModelInfo
from workers.serving.registration import model_register


class Command(BaseCommand):
    help = __doc__

    def create_parser(self, prog_name, subcommand, **kwargs):
        # --version is ours (the model's version), replacing Django's.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("name", help="the id clients send as `model`")
        parser.add_argument("source", help="preset:<name>[@seed] or an absolute directory path")
        parser.add_argument("--description", default="")
        for tokens in ("input", "output", "cached"):
            parser.add_argument(
                f"--price-{tokens}",
                type=int,
                default=0,
                help=(f"{tokens} tokens: micro-cents per million (10_000_000 = $0.10)"),
            )
        parser.add_argument(
            "--runtime",
            choices=["engine", "vllm"],
            default="engine",
            help="engine: our engine; vllm: a `vllm serve` child of each worker "
            "hosting it (FAIRLANE_VLLM_COMMAND)",
        )
        parser.add_argument(
            "--quantization",
            choices=["int8", "int4"],
            default="",
            help="weight-only quantization of the linear layers at load",
        )
        parser.add_argument(
            "--quantization-group-size",
            type=int,
            choices=[32, 64, 128],
            default=128,
            help="int4: input columns per scale",
        )
        parser.add_argument(
            "--speculative-method",
            choices=["ngram", "draft"],
            default="",
            help="speculative decoding: n-gram prompt lookup, or a draft model (which also "
            "gets prompt lookup, chosen per batch size by measured costs)",
        )
        parser.add_argument(
            "--speculative-tokens", type=int, default=4, help="draft tokens per step (1-16)"
        )
        parser.add_argument(
            "--version", default="", help="a label for this version of the model (e.g. v2)"
        )
        parser.add_argument(
            "--canary",
            type=int,
            default=None,
            metavar="PERCENT",
            help="serve the version as a canary taking this share of requests",
        )
        parser.add_argument(
            "--min-replicas",
            type=int,
            default=None,
            help="workers that should host it, at least (the autoscaler reads it)",
        )
        parser.add_argument(
            "--max-replicas", type=int, default=None, help="workers that should host it, at most"
        )
        parser.add_argument(
            "--speculative-draft",
            default="",
            help="the draft model (preset:<name>[@seed] or an absolute path), same tokenizer",
        )
        parser.add_argument(
            "--speculative-draft-only",
            action="store_true",
            help="the draft model alone: no prompt lookup chosen beside it per batch size",
        )

    def handle(
        self,
        *args,
        name,
        source,
        description,
        price_input,
        price_output,
        price_cached,
        quantization,
        quantization_group_size,
        speculative_method,
        speculative_tokens,
        speculative_draft,
        speculative_draft_only,
        runtime,
        version,
        canary,
        min_replicas,
        max_replicas,
        **options,
    ):
        try:
            row = model_register(
                name=name,
                source=source,
                description=description,
                price_input_per_mtok=price_input,
                price_output_per_mtok=price_output,
                price_cached_per_mtok=price_cached,
                quantization=quantization,
                quantization_group_size=quantization_group_size,
                speculative_method=speculative_method,
                speculative_tokens=speculative_tokens,
                speculative_draft=speculative_draft,
                speculative_draft_only=speculative_draft_only,
                runtime=runtime,
                version=version,
                canary_weight=canary,
                min_replicas=min_replicas,
                max_replicas=max_replicas,
            )
        except InvalidRequest as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"registered {row.name} -> {row.source}"
            + (" (runtime vllm)" if row.runtime == "vllm" else "")
        )
        if version:
            split = ", ".join(
                f"{label} {weight}%" for label, _, _, weight in ModelInfo.of(row).versions
            )
            self.stdout.write(f"  versions {split}")
        if row.quantization:
            self.stdout.write(
                f"  quantization {row.quantization}"
                + (
                    f" (groups of {row.quantization_group_size})"
                    if row.quantization == "int4"
                    else ""
                )
            )
        if row.speculative_method:
            self.stdout.write(
                f"  speculation {row.speculative_method}, k={row.speculative_tokens}"
                + (f", draft {row.speculative_draft}" if row.speculative_draft else "")
                + (
                    (
                        " alone"
                        if row.speculative_draft_only
                        else ", and prompt lookup (chosen per batch size)"
                    )
                    if row.speculative_method == "draft"
                    else ""
                )
            )
        if row.manifest_digest:
            self.stdout.write(
                f"  manifest {row.manifest_digest}\n  signer   "
                f"{row.signer or '(unsigned)'}\n  origin   {row.origin}\n"
                f"  license  {row.license}"
            )
