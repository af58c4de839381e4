"""Versions of a served model in the registry: a swap, a canary and its split (sticky per
conversation), promote and rollback, the commands, and what responses and the ledger call a
version. The same with real worker processes: tests/workers/test_versions_processes.py."""

import collections

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tenants.errors import InvalidRequest
from workers.metrics import ReplicaCollector
from workers.models import ModelVersion, ServedModel
from workers.serving.catalog import ModelInfo, model_dir, model_get
from workers.serving.registration import model_register
from workers.serving.versions import (
    version_choose,
    version_fingerprint,
    version_promote,
    version_rollback,
    version_tag,
    versions_of,
)

pytestmark = pytest.mark.django_db


def states(name="tiny") -> dict[str, tuple[str, int]]:
    return {
        v.label: (v.state, v.weight) for v in ModelVersion.objects.filter(served_model__name=name)
    }


def test_a_model_without_versions_is_its_own_implicit_version():
    model_register(name="tiny", source="preset:tiny")
    info = model_get(name="tiny")
    assert info.versions == () and info.version == ""
    assert versions_of(info) == [info] and version_choose(info, key="k") is info
    row = ServedModel.objects.get(name="tiny")
    assert (
        version_fingerprint(info.to_dict()) == "fp_" + row.manifest_digest.rpartition(":")[2][:10]
    )
    assert version_tag(info.to_dict()) == version_fingerprint(info.to_dict())
    remote = ModelInfo(name="gpt", source="backend:openai").to_dict()
    assert version_tag(remote) == "" and version_fingerprint(remote) is None


def test_a_swap_points_the_name_at_the_new_version_and_keeps_the_old_for_rollback():
    model_register(name="tiny", source="preset:tiny@1")
    model_register(name="tiny", source="preset:tiny@2", version="v2")
    assert states() == {"initial": ("retired", 0), "v2": ("primary", 0)}
    row = ServedModel.objects.get(name="tiny")
    assert row.source == "preset:tiny@2"
    info = model_get(name="tiny")
    assert [v.version for v in versions_of(info)] == ["v2"] and info.versions[0][3] == 100
    chosen = version_choose(info, key="anything")
    assert chosen.source == "preset:tiny@2" and chosen.digest == row.manifest_digest
    assert ModelInfo(**chosen.to_dict()) == chosen  # travels as JSON in the job

    assert version_rollback(name="tiny").label == "initial"
    assert states() == {"initial": ("primary", 0), "v2": ("retired", 0)}
    assert ServedModel.objects.get(name="tiny").source == "preset:tiny@1"
    with pytest.raises(InvalidRequest):  # a new source needs a version label now
        model_register(name="tiny", source="preset:tiny@3")


def test_a_canary_takes_its_weight_sticky_per_conversation_then_is_promoted():
    model_register(name="tiny", source="preset:tiny@1", version="v1")
    model_register(name="tiny", source="preset:tiny@2", version="v2", canary_weight=5)
    assert states() == {"v1": ("primary", 0), "v2": ("canary", 5)}
    info = model_get(name="tiny")
    assert [(label, weight) for label, _, _, weight in info.versions] == [("v1", 95), ("v2", 5)]
    assert ServedModel.objects.get(name="tiny").source == "preset:tiny@1"  # still the primary's

    picks = collections.Counter(
        version_choose(info, key=f"1\x00conversation {i}").version for i in range(10_000)
    )
    assert abs(picks["v2"] / 10_000 - 0.05) < 0.01
    assert {version_choose(info, key="1\x00same").version for _ in range(20)} == {
        version_choose(info, key="1\x00same").version
    }  # sticky
    randomly = collections.Counter(version_choose(info).version for _ in range(4_000))
    assert 0.03 < randomly["v2"] / 4_000 < 0.07

    assert version_promote(name="tiny").label == "v2"
    assert states() == {"v1": ("retired", 0), "v2": ("primary", 0)}
    assert ServedModel.objects.get(name="tiny").source == "preset:tiny@2"
    assert version_rollback(name="tiny").label == "v1"  # back to the primary before


def test_rollback_of_a_canary_retires_it_and_the_primary_takes_everything():
    model_register(name="tiny", source="preset:tiny@1", version="v1")
    model_register(name="tiny", source="preset:tiny@2", version="v2", canary_weight=30)
    assert version_rollback(name="tiny").label == "v1"
    assert states() == {"v1": ("primary", 0), "v2": ("retired", 0)}
    with pytest.raises(InvalidRequest):  # v1 was the first: nothing before it
        version_rollback(name="tiny")
    with pytest.raises(InvalidRequest):
        version_promote(name="tiny")  # no canary


def test_a_canary_needs_a_primary_and_a_weight_in_range():
    with pytest.raises(InvalidRequest):
        model_register(name="new", source="preset:tiny", version="v1", canary_weight=5)
    model_register(name="tiny", source="preset:tiny@1", version="v1")
    with pytest.raises(InvalidRequest):
        model_register(name="tiny", source="preset:tiny@2", version="v2", canary_weight=101)
    with pytest.raises(InvalidRequest):
        model_register(name="tiny", source="preset:tiny@1", version="v1", canary_weight=5)


def test_the_commands_register_a_canary_promote_and_roll_back(capsys):
    call_command("model_register", "tiny", "preset:tiny@1", "--version", "v1")
    call_command("model_register", "tiny", "preset:tiny@2", "--version", "v2", "--canary", "10")
    assert "versions v1 90%, v2 10%" in capsys.readouterr().out
    call_command("model_promote", "tiny")
    assert "tiny -> v2" in capsys.readouterr().out
    call_command("model_rollback", "tiny")
    assert "tiny -> v1" in capsys.readouterr().out
    with pytest.raises(CommandError):
        call_command("model_promote", "tiny")
    with pytest.raises(CommandError):
        call_command("model_rollback", "missing")


def test_replica_bounds_are_checked_and_exported_for_the_autoscaler():
    with pytest.raises(InvalidRequest):
        model_register(name="tiny", source="preset:tiny", min_replicas=3, max_replicas=2)
    model_register(
        name="tiny", source="preset:tiny@1", version="v1", min_replicas=2, max_replicas=4
    )
    model_register(name="tiny", source="preset:tiny@2", version="v2", canary_weight=5)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in ReplicaCollector().collect()
        for s in family.samples
    }
    assert samples[("fairlane_model_replicas_min", (("model", "tiny"),))] == 2
    assert samples[("fairlane_model_replicas_max", (("model", "tiny"),))] == 4
    assert ("fairlane_model_replicas", (("model", "tiny"),)) in samples
    assert samples[("fairlane_model_version_weight", (("model", "tiny"), ("version", "v2")))] == 5
    assert model_dir("preset:tiny@2") != model_dir("preset:tiny@1")
