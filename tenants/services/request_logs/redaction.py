"""What a request log keeps of a request's content: every string with secrets replaced (API
keys, tokens, private keys, `password=...`: always), and emails and long numbers when the
tenant asks; images as the sha256 of their bytes (a data URL's) or of their URL, never the
image."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any

SECRET = "[REDACTED:secret]"
EMAIL = "[REDACTED:email]"
NUMBER = "[REDACTED:number]"

# Providers' and our own key formats, bearer tokens, JWTs and PEM private keys.
SECRET_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{16,}"),  # OpenAI, Anthropic (sk-ant-), Stripe
    re.compile(r"\bfl-[A-Za-z0-9]+-[A-Za-z0-9]{20,}"),  # our API keys
    re.compile(r"\bscim-[A-Za-z0-9]+-[A-Za-z0-9]{20,}"),  # our SCIM tokens
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{16,}"),
]
# `password = hunter22`, `"api_key": "..."`: the name stays, its value goes.
SECRET_ASSIGNMENT = re.compile(
    r"""(?ix)\b((?:api[_-]?key|secret(?:[_-]?key)?|client[_-]?secret|password|passwd|
    access[_-]?token|auth[_-]?token|access[_-]?key)["']?\s*[:=]\s*["']?)([^\s"',;]{6,})"""
)
EMAIL_PATTERN = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")
# Phone, card, account and id numbers: six or more digits, spaces, dots or dashes between.
NUMBER_PATTERN = re.compile(r"(?<![\w.])\+?\d(?:[ .\-]?\d){5,}(?![\w])")


@dataclass(frozen=True, slots=True)
class Redaction:
    emails: bool = True
    numbers: bool = False

    def text(self, value: str) -> str:
        for pattern in SECRET_PATTERNS:
            value = pattern.sub(SECRET, value)
        value = SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + SECRET, value)
        if self.emails:
            value = EMAIL_PATTERN.sub(EMAIL, value)
        if self.numbers:
            value = NUMBER_PATTERN.sub(NUMBER, value)
        return value


def image_hash(url: str) -> str:
    """sha256 of a data URL's bytes, or of the URL itself (a remote image is never fetched)."""
    if url.startswith("data:") and "," in url:
        header, payload = url.split(",", 1)
        try:
            data = (
                base64.b64decode(payload, validate=False)
                if header.endswith(";base64")
                else payload.encode()
            )
        except (binascii.Error, ValueError):
            data = url.encode()
        return "sha256:" + hashlib.sha256(data).hexdigest()
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()


def _image_part(part: dict) -> dict | None:
    """An image content part (OpenAI's image_url, Anthropic's image) with its hash only."""
    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        return {"type": "image_url", "image_sha256": image_hash(str(url or ""))}
    if part.get("type") in ("image", "input_image"):
        given = part.get("source")
        source: dict = given if isinstance(given, dict) else {}
        url = source.get("data") or source.get("url") or part.get("image_url") or ""
        return {"type": part["type"], "image_sha256": image_hash(str(url))}
    return None


def content_redact(value: Any, redaction: Redaction) -> Any:
    """The content as it is stored: the same shape, every string redacted, images hashed."""
    if isinstance(value, str):
        return redaction.text(value)
    if isinstance(value, dict):
        image = _image_part(value)
        if image is not None:
            return image
        return {key: content_redact(item, redaction) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [content_redact(item, redaction) for item in value]
    return value
