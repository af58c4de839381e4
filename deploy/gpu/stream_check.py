"""Stream a chat completion with the official `openai` client and check what a user relies on:
a role chunk, content, one finish_reason, the usage chunk (include_usage) and its counts.
Prints one JSON line; exits non-zero when a check fails.

    python deploy/gpu/stream_check.py --base-url http://127.0.0.1:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import openai


def stream_check(base_url: str, model: str, api_key: str, max_tokens: int = 16) -> dict:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    started = time.monotonic()
    first = None
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Write one line about GPUs."}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for chunk in chunks:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - started
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    usage = chunks[-1].usage
    problems = []
    if not chunks or not chunks[0].choices or chunks[0].choices[0].delta.role != "assistant":
        problems.append("the first chunk carries no assistant role")
    if not text:
        problems.append("no content streamed")
    if len(finishes) != 1 or finishes[0] not in ("stop", "length"):
        problems.append(f"finish reasons {finishes}")
    if usage is None or not (0 < usage.completion_tokens <= max_tokens) or usage.prompt_tokens <= 0:
        problems.append(f"usage {usage}")
    return {
        "model": model,
        "chunks": len(chunks),
        "text": text,
        "finish": finishes,
        "usage": usage.model_dump() if usage else None,
        "first_token_s": round(first, 3) if first is not None else None,
        "total_s": round(time.monotonic() - started, 3),
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    result = stream_check(args.base_url, args.model, args.api_key, args.max_tokens)
    print(json.dumps(result))
    sys.exit(1 if result["problems"] else 0)


if __name__ == "__main__":
    main()
