"""Real processes for tests: the launchers live with the benchmarks that use them too."""

from routing.bench.processes import AsgiServer, CeleryWorker, Process, free_port

__all__ = ["AsgiServer", "CeleryWorker", "Process", "free_port"]
