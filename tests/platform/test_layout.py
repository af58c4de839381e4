"""The layout's traps: platform/ must stay a source root that shadows nothing."""

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_platform_gives_the_standard_library_module():
    import platform

    assert Path(platform.__file__).parent == Path(sysconfig.get_paths()["stdlib"])
    assert platform.python_version().startswith("3.")


def test_platform_dir_is_a_source_root_whose_modules_shadow_nothing_installed():
    assert not (ROOT / "platform" / "__init__.py").exists()
    ours = {p.stem for p in (ROOT / "platform").glob("*.py")}
    assert {"settings", "urls", "asgi", "celery_app"} <= ours
    installed = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    assert not ours & installed, f"platform/ modules named after installed ones: {ours & installed}"


def test_a_new_users_imports_work_with_the_documented_pythonpath():
    """What broke when platform/ was a package: uuid, torch and the Celery app import fine."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
    }
    code = (
        "import platform, uuid, torch, celery_app; "
        "print(platform.system(), uuid.uuid4().version, torch.tensor([1]).item(), "
        "celery_app.app.main)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [platform_system(), "4", "1", "fairlane"]


def platform_system() -> str:
    import platform

    return platform.system()
