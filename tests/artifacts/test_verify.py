"""The checks themselves, on real files: the tamper cases of issue 17, each refused with the
reason a person can act on, and a correctly signed model accepted."""

import base64
import json
import os
import pickle

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.artifacts.conftest import PREDICATE, flip_byte
from workers.artifacts.keys import key_id
from workers.artifacts.manifest import MANIFEST_NAME, SIGNATURE_NAME, canonical
from workers.artifacts.signing import model_sign, signature_document
from workers.artifacts.verify import TRUSTED, UNSIGNED, UNTRUSTED, model_verify


def trust(key):
    return {key_id(key.public_key()): key.public_key()}


def codes(result):
    return [p.code for p in result.problems]


def test_a_correctly_signed_model_verifies(signed_model, signing_key):
    result = model_verify(signed_model, trust(signing_key))
    assert result.ok and result.trust == TRUSTED, result.problems
    assert result.signer == key_id(signing_key.public_key()) and result.predicate == PREDICATE
    assert result.digest.startswith("sha256:") and result.files == 6


def test_the_manifest_is_a_canonical_in_toto_statement(signed_model):
    data = (signed_model / MANIFEST_NAME).read_bytes()
    statement = json.loads(data)
    assert canonical(statement) == data and b" " not in data.replace(b"hf://", b"")
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    names = [s["name"] for s in statement["subject"]]
    assert names == sorted(names) and "model.safetensors" in names
    weights = next(s for s in statement["subject"] if s["name"] == "model.safetensors")
    assert weights["annotations"]["size"] == (signed_model / "model.safetensors").stat().st_size
    assert len(weights["digest"]["sha256"]) == 64


def test_one_byte_flipped_in_the_weights(signed_model, signing_key):
    flip_byte(signed_model / "model.safetensors")
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["hash_mismatch"]
    assert "model.safetensors" in result.problems[0].message


def test_config_json_changed_in_place(signed_model, signing_key):
    config = signed_model / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["hash_mismatch"]


def test_a_file_added(signed_model, signing_key):
    (signed_model / "chat_template.jinja").write_text("{{ messages }}")
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["extra_file"] and "chat_template.jinja" in str(result.problems[0])


def test_a_file_removed(signed_model, signing_key):
    (signed_model / "tokenizer_config.json").unlink()
    assert codes(model_verify(signed_model, trust(signing_key))) == ["missing_file"]


def test_a_file_renamed(signed_model, signing_key):
    os.rename(signed_model / "tokenizer.json", signed_model / "tokenizer.json.bak")
    assert sorted(codes(model_verify(signed_model, trust(signing_key)))) == [
        "extra_file",
        "missing_file",
    ]


def test_a_file_added_in_a_subdirectory(signed_model, signing_key):
    (signed_model / "extra").mkdir()
    (signed_model / "extra" / "notes.txt").write_text("x")
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["extra_file"] and "extra/notes.txt" in str(result.problems[0])


def test_signed_by_a_key_not_trusted_here(signed_model):
    stranger = Ed25519PrivateKey.generate()
    result = model_verify(signed_model, trust(stranger))
    assert result.ok and result.trust == UNTRUSTED  # the policy refuses it (test_load)


def test_a_signature_by_another_key_claiming_the_trusted_ones_id(signed_model, signing_key):
    forger = Ed25519PrivateKey.generate()
    forged = signature_document(forger, (signed_model / MANIFEST_NAME).read_bytes())
    document = json.loads((signed_model / SIGNATURE_NAME).read_bytes())
    document["sig"] = forged["sig"]  # keyid and public key still say the trusted key
    (signed_model / SIGNATURE_NAME).write_bytes(canonical(document))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["bad_signature"]


def test_a_manifest_edited_after_signing(signed_model, signing_key):
    statement = json.loads((signed_model / MANIFEST_NAME).read_bytes())
    statement["predicate"]["license"] = "mit"
    (signed_model / MANIFEST_NAME).write_bytes(canonical(statement))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["bad_signature"]


@pytest.mark.parametrize("keep", [0, 40, 100])
def test_a_truncated_signature(signed_model, signing_key, keep):
    path = signed_model / SIGNATURE_NAME
    path.write_bytes(path.read_bytes()[:keep])
    assert codes(model_verify(signed_model, trust(signing_key))) == ["malformed_signature"]


def test_a_signature_cut_to_32_bytes_inside_valid_json(signed_model, signing_key):
    path = signed_model / SIGNATURE_NAME
    document = json.loads(path.read_bytes())
    document["sig"] = base64.b64encode(base64.b64decode(document["sig"])[:32]).decode()
    path.write_bytes(canonical(document))
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["malformed_signature"] and "32 bytes" in str(result.problems[0])


def test_a_pickled_bin_is_refused_even_if_signed(signed_model, signing_key):
    torch.save({"w": torch.zeros(2)}, signed_model / "pytorch_model.bin")
    model_sign(signed_model, signing_key, **PREDICATE)  # signing does not make pickle safe
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["pickle"] and "pytorch_model.bin" in str(result.problems[0])


def test_a_pickle_under_another_name_is_found_by_its_bytes(signed_model, signing_key):
    (signed_model / "weights.dat").write_bytes(pickle.dumps({"w": [1, 2]}, protocol=4))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["pickle"]


def test_a_torch_save_named_safetensors_is_found_by_its_bytes(signed_model, signing_key):
    torch.save({"w": torch.zeros(2)}, signed_model / "model-00002.safetensors")
    assert codes(model_verify(signed_model, trust(signing_key))) == ["pickle"]


def test_a_safetensors_name_on_other_bytes(signed_model, signing_key):
    (signed_model / "model-00002.safetensors").write_bytes(b"\x10" + b"\x00" * 40)
    assert codes(model_verify(signed_model, trust(signing_key))) == ["not_safetensors"]


def test_a_symlink_out_of_the_directory(signed_model, signing_key, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text((signed_model / "config.json").read_text())  # same bytes, even
    (signed_model / "config.json").unlink()
    (signed_model / "config.json").symlink_to(outside)
    result = model_verify(signed_model, trust(signing_key))
    assert codes(result) == ["symlink"] and str(outside) in str(result.problems[0])


def test_a_symlinked_subdirectory_is_not_followed(signed_model, signing_key, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret").write_text("x")
    (signed_model / "shards").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert codes(model_verify(signed_model, trust(signing_key))) == ["symlink"]


def test_a_manifest_naming_a_path_outside_the_directory(signed_model, signing_key):
    statement = json.loads((signed_model / MANIFEST_NAME).read_bytes())
    statement["subject"].append(
        {"name": "../../etc/passwd", "digest": {"sha256": "0" * 64}, "annotations": {"size": 1}}
    )
    data = canonical(statement)
    (signed_model / MANIFEST_NAME).write_bytes(data)
    (signed_model / SIGNATURE_NAME).write_bytes(canonical(signature_document(signing_key, data)))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["path_escape"]


def test_a_manifest_that_is_not_canonical(signed_model, signing_key):
    statement = json.loads((signed_model / MANIFEST_NAME).read_bytes())
    data = json.dumps(statement, indent=2).encode()
    (signed_model / MANIFEST_NAME).write_bytes(data)
    (signed_model / SIGNATURE_NAME).write_bytes(canonical(signature_document(signing_key, data)))
    assert codes(model_verify(signed_model, trust(signing_key))) == ["malformed_manifest"]


def test_no_manifest_is_unsigned_not_a_problem_by_itself(pristine, signing_key):
    result = model_verify(pristine, trust(signing_key))
    assert result.ok and result.trust == UNSIGNED and result.digest == ""


def test_exhaustive_lists_every_problem(signed_model, signing_key):
    flip_byte(signed_model / "model.safetensors")
    (signed_model / "tokenizer_config.json").unlink()
    (signed_model / "x.pt").write_bytes(b"")
    quick = model_verify(signed_model, trust(signing_key))
    assert codes(quick) == ["pickle"]  # stage 1 stops the check before any hashing
    every = model_verify(signed_model, trust(signing_key), exhaustive=True)
    assert sorted(codes(every)) == ["extra_file", "hash_mismatch", "missing_file", "pickle"]


def test_signing_twice_with_one_key_writes_the_same_bytes(signed_model, signing_key):
    before = {n: (signed_model / n).read_bytes() for n in (MANIFEST_NAME, SIGNATURE_NAME)}
    model_sign(signed_model, signing_key, **PREDICATE)
    assert {n: (signed_model / n).read_bytes() for n in before} == before


def test_the_model_path_itself_must_be_the_real_directory(signed_model, signing_key, tmp_path):
    (tmp_path / "alias").symlink_to(signed_model, target_is_directory=True)
    result = model_verify(tmp_path / "alias", trust(signing_key))
    assert codes(result) == ["symlink"] and "register the directory" in str(result.problems[0])
    assert codes(model_verify(tmp_path / "absent", trust(signing_key))) == ["not_found"]
