"""docker-compose's GPU profile: a worker with the NVIDIA device reservation, on CUDA, built
with the CUDA torch and requirements-gpu.txt, and absent unless the profile is asked for."""

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_the_gpu_worker_reserves_a_gpu_and_runs_on_cuda():
    gpu = COMPOSE["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert gpu["environment"]["FAIRLANE_ENGINE_DEVICE"] == "cuda"
    # the rest of the environment is the shared one (database, Redis, secret)
    assert (
        gpu["environment"]["REDIS_URL"] == COMPOSE["services"]["worker"]["environment"]["REDIS_URL"]
    )
    command = gpu["command"]
    assert command[command.index("-Q") + 1] == "gpu"


def test_only_the_gpu_worker_is_behind_a_profile():
    profiled = {name for name, spec in COMPOSE["services"].items() if spec.get("profiles")}
    assert profiled == {"worker-gpu"}
    assert "deploy" not in COMPOSE["services"]["worker"]


def test_the_gpu_build_installs_cuda_torch_and_vllm():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    args = COMPOSE["services"]["worker-gpu"]["build"]["args"]
    assert args["GPU"] and "download.pytorch.org/whl/cpu" not in args["TORCH_INDEX"]
    assert re.search(
        r'if \[ -n "\$GPU" \]; then pip install .*-r requirements-gpu.txt ;', dockerfile
    )
    assert re.search(r"ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu", dockerfile)
    assert "vllm==" in (DEPLOY.parent / "requirements-gpu.txt").read_text()
