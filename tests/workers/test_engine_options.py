"""Per-model engine options in the registry: quantization and speculation travel from
`model_register` to the engine a worker builds; bad options are refused and change nothing."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from tenants.errors import InvalidRequest
from workers.artifacts import presets
from workers.artifacts.load import artifact_check
from workers.artifacts.verify import TRUSTED
from workers.engine import SamplingParams
from workers.models import ServedModel
from workers.serving.catalog import ModelInfo, model_dir, model_engine_options, model_get
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db


@pytest.fixture
def data(settings, tmp_path):
    settings.FAIRLANE_MODEL_DIR = tmp_path / "models"
    settings.FAIRLANE_DEV_SIGNING_KEY = str(tmp_path / "signing" / "dev.pem")
    settings.FAIRLANE_MODEL_SIGNATURES = "require"
    presets._known_signed.clear()
    yield tmp_path
    presets._known_signed.clear()


def test_model_register_records_engine_options_that_reach_the_engine_config(data, capsys):
    call_command(
        "model_register",
        "code",
        "preset:tiny",
        "--quantization",
        "int4",
        "--quantization-group-size",
        "32",
        "--speculative-method",
        "draft",
        "--speculative-tokens",
        "3",
        "--speculative-draft",
        "preset:tiny@1",
    )
    out = capsys.readouterr().out
    assert "quantization int4 (groups of 32)" in out and "speculation draft, k=3" in out
    assert "and prompt lookup (chosen per batch size)" in out
    info = model_get(name="code")
    assert (
        ModelInfo(**json.loads(json.dumps(info.to_dict()))) == info
    )  # it travels to workers as JSON
    options = model_engine_options(info)
    assert options["quantization"] == "int4" and options["quantization_group_size"] == 32
    spec = options["speculative"]
    assert (spec.method, spec.num_speculative_tokens) == ("draft", 3)
    assert spec.model == str(data / "models" / "tiny-seed1")
    assert spec.also_prompt_lookup  # a draft model also gets prompt lookup, by default


def test_a_draft_model_alone_gets_no_method_choice(data, capsys):
    """`--speculative-draft-only` reaches the engine: its speculator is the draft model's
    alone, where the default builds the choice between it and prompt lookup."""
    from workers.engine import EngineConfig, LLMEngine
    from workers.engine.spec.choice import MethodChoice
    from workers.engine.spec.speculator import Speculator

    common = ("--speculative-method", "draft", "--speculative-draft", "preset:tiny@1")
    call_command("model_register", "alone", "preset:tiny", *common, "--speculative-draft-only")
    assert "draft preset:tiny@1 alone" in capsys.readouterr().out
    call_command("model_register", "both", "preset:tiny", *common)
    assert ServedModel.objects.get(name="alone").speculative_draft_only
    assert not ServedModel.objects.get(name="both").speculative_draft_only
    built = {}
    for name in ("alone", "both"):
        info = model_get(name=name)
        assert ModelInfo(**json.loads(json.dumps(info.to_dict()))) == info
        options = model_engine_options(info)
        engine = LLMEngine(EngineConfig(model=str(model_dir(info.source)), **options))
        built[name] = engine.speculator
    assert type(built["alone"]) is Speculator
    assert isinstance(built["both"], MethodChoice)


def test_a_model_without_options_gets_none(data):
    model_register(name="plain", source="preset:tiny")
    assert model_engine_options(model_get(name="plain")) == {
        "quantization": None,
        "quantization_group_size": 128,
    }


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"speculative_method": "draft"}, "speculative_draft"),
        ({"speculative_method": "ngram", "speculative_draft": "preset:tiny"}, "speculative_draft"),
        ({"speculative_method": "draft", "speculative_draft": "preset:nope"}, "speculative_draft"),
        ({"speculative_method": "draft", "speculative_draft": "relative/dir"}, "speculative_draft"),
        ({"speculative_method": "ngram", "speculative_tokens": 17}, "speculative_tokens"),
        ({"speculative_method": "ngram", "speculative_draft_only": True}, "speculative_draft_only"),
        ({"speculative_method": "eagle"}, "speculative_method"),
        ({"quantization": "int3"}, "quantization"),
        ({"quantization": "int4", "quantization_group_size": 48}, "quantization_group_size"),
    ],
)
def test_bad_engine_options_are_refused_and_change_nothing(data, options, param):
    model_register(name="m", source="preset:tiny")
    with pytest.raises(InvalidRequest) as caught:
        model_register(name="m", source="preset:tiny", **options)
    assert caught.value.param == param
    row = ServedModel.objects.get(name="m")
    assert (row.quantization, row.speculative_method, row.speculative_draft) == ("", "", "")
    assert not row.speculative_draft_only


def test_the_command_reports_a_bad_option_in_one_line(data):
    with pytest.raises(CommandError, match="draft"):
        call_command("model_register", "m", "preset:tiny", "--speculative-method", "draft")


def test_a_worker_builds_the_registered_engine_and_it_streams_and_exports_its_counters(data):
    from routing.runtimes import runtime_build
    from workers.metrics import EngineCollector

    model_register(
        name="code",
        source="preset:tiny",
        quantization="int8",
        speculative_method="draft",
        speculative_tokens=3,
        speculative_draft="preset:tiny@1",
    )
    runtime = runtime_build("embedded")
    host = runtime.engine_host
    try:
        front = host.engine(model_get(name="code"))
        assert (
            artifact_check(path=data / "models" / "tiny-seed1")[0].trust == TRUSTED
        )  # the draft was checked too
        tokens = [
            t
            for out in front.stream(
                [5, 6, 7, 8] * 4, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
            )
            for t in out.new_token_ids
        ]
        assert len(tokens) == 12
        stats = host.stats()["code"]
        assert stats["quantization"] == "int8" and stats["speculative_method"] == "draft"
        assert stats["spec_decode_num_drafts"] > 0
        # Prometheus shows the speculation counters, as the runtime's pool reads them.
        collector = EngineCollector()
        collector.pool = runtime.pool
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in collector.collect()
            for s in family.samples
        }
        labels = (("model", "code"), ("worker", "embedded"))
        for name in (
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
        ):
            assert samples[(f"fairlane_engine_{name}_total", labels)] == stats[name]
        positions = stats["spec_decode_num_accepted_tokens_per_pos"]
        assert (
            len(positions) == 3
            and samples[
                (
                    "fairlane_engine_spec_decode_num_accepted_tokens_per_pos_total",
                    (("model", "code"), ("position", "2"), ("worker", "embedded")),
                )
            ]
            == positions[2]
        )
    finally:
        host.shutdown()
