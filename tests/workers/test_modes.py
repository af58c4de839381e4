"""The engine mode is chosen once (workers/modes.py): embedded or distributed, picked from
FAIRLANE_ENGINE_MODE and kept; "celery", the distributed mode's former name, still works."""

import os
import subprocess
import sys

from tests.conftest import ROOT
from workers.modes import DistributedMode, EmbeddedMode, mode_get


def test_the_mode_is_picked_once_and_again_only_when_the_setting_changes(settings):
    settings.FAIRLANE_ENGINE_MODE = "embedded"
    mode = mode_get()
    assert isinstance(mode, EmbeddedMode) and mode_get() is mode
    assert mode.name == "embedded"

    settings.FAIRLANE_ENGINE_MODE = "distributed"
    mode = mode_get()
    assert isinstance(mode, DistributedMode) and mode_get() is mode
    assert mode.name == "distributed" and mode.node == "celery"


def test_celery_still_names_the_distributed_mode(settings):
    settings.FAIRLANE_ENGINE_MODE = "celery"
    assert isinstance(mode_get(), DistributedMode)


def test_the_settings_read_celery_from_the_environment_as_distributed():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
           "DJANGO_SETTINGS_MODULE": "settings"}
    code = "import django; django.setup(); from django.conf import settings; " \
           "print(settings.FAIRLANE_ENGINE_MODE)"
    for given, read in (("celery", "distributed"), ("distributed", "distributed"),
                        ("embedded", "embedded")):
        out = subprocess.run([sys.executable, "-c", code], env={
            **env, "FAIRLANE_ENGINE_MODE": given}, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == read
    refused = subprocess.run([sys.executable, "-c", code], env={
        **env, "FAIRLANE_ENGINE_MODE": "gpu"}, capture_output=True, text=True)
    assert refused.returncode != 0 and "must be 'embedded' or 'distributed'" in refused.stderr
