"""When the file PROVIDER_TAMPER names says so, the token endpoint's ID token has one claim
changed after it was signed: what an attacker on the way would send."""

import base64
import json
import os
from pathlib import Path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["email"] = "mallory@acme.example"
    return ".".join([header, _b64(json.dumps(claims).encode()), signature])


class TamperMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        flag = Path(os.environ["PROVIDER_TAMPER"])
        if request.path.endswith("/token/") and flag.exists() and response.status_code == 200:
            body = json.loads(response.content)
            body["id_token"] = _tampered(body["id_token"])
            response.content = json.dumps(body).encode()
        return response
