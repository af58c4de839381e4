"""Run a module with every engine on CUDA (the engine's own device default is the CPU):
`python -m deploy.gpu.on_cuda workers.engine.bench --quick`."""

from __future__ import annotations

import runpy
import sys


def engines_on_cuda() -> None:
    """EngineConfig() without a device means CUDA from now on in this process."""
    from workers.engine.config import EngineConfig

    if getattr(EngineConfig.__init__, "_on_cuda", False):
        return
    original = EngineConfig.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("device", "cuda")
        original(self, *args, **kwargs)

    init._on_cuda = True
    EngineConfig.__init__ = init


if __name__ == "__main__":
    engines_on_cuda()
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
