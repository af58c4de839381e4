"""Settings read from the environment as a fresh process reads them (platform/
fairlane_settings.py): renamed variables keep working under their former names, and settings
derived from others are decided there once."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def settings_read(name: str, **environ: str) -> str:
    """A setting as a fresh process reads it with `environ` added to ours (the claim time's
    variables, old and new, are only those given)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
    }
    for key in ("FAIRLANE_CLAIM_SECONDS", "FAIRLANE_LEASE_SECONDS"):
        env.pop(key, None)
    env.update(environ)
    code = (
        f"import django; django.setup(); from django.conf import settings; print(settings.{name})"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_claim_time_is_read_from_its_former_name_too():
    assert settings_read("FAIRLANE_CLAIM_SECONDS") == "10"
    assert settings_read("FAIRLANE_CLAIM_SECONDS", FAIRLANE_LEASE_SECONDS="7") == "7"
    assert settings_read("FAIRLANE_CLAIM_SECONDS", FAIRLANE_CLAIM_SECONDS="3") == "3"


def test_the_claim_time_under_its_new_name_wins_over_the_former_one():
    assert (
        settings_read(
            "FAIRLANE_CLAIM_SECONDS", FAIRLANE_CLAIM_SECONDS="3", FAIRLANE_LEASE_SECONDS="7"
        )
        == "3"
    )
