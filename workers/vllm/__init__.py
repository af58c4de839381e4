"""Models whose runtime is vLLM: a managed `vllm serve` child process per model on each worker
hosting it (server.py), behind our engine's interface (engine.py). vllm itself is never
imported here: it runs in its own process, installed from requirements-gpu.txt on GPU workers."""

from workers.vllm.engine import VllmCrashed, VllmEngine
from workers.vllm.server import VllmStartFailed

__all__ = ["VllmCrashed", "VllmEngine", "VllmStartFailed"]
