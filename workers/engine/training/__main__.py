"""python -m workers.engine.training [--models-dir var/models] [--seed 0] [--threads 2]
[--max-minutes 15]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from workers.engine.training.train import train_pair


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m workers.engine.training",
        description="Train the draft/target preset pair.",
    )
    p.add_argument("--models-dir", type=Path, default=Path("var/models"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=15.0,
        help="each model stops training after this long (and says so)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = train_pair(
        args.models_dir,
        seed=args.seed,
        max_seconds=args.max_minutes * 60,
        log=lambda line: print(line, flush=True),
    )
    print(json.dumps(result, indent=2, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
