"""A pytest plugin for the GPU check: every engine the tests build runs on CUDA unless the test
names a device itself (`pytest -p deploy.gpu.cuda_plugin tests/engine/...`). Hugging Face's
reference stays on the CPU, so the engine on the GPU is compared with it there."""

from __future__ import annotations

import pytest

from deploy.gpu.on_cuda import engines_on_cuda


def pytest_configure(config: pytest.Config) -> None:
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError("deploy.gpu.cuda_plugin: torch sees no CUDA device")
    engines_on_cuda()


def pytest_report_header(config: pytest.Config) -> str:
    import torch

    return f"engines on CUDA: {torch.cuda.get_device_name(0)} (torch {torch.__version__})"
