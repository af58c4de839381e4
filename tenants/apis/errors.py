"""One mapping from errors to HTTP responses in the OpenAI error shape, for DRF views and for
Django's own 404/500 pages under /api/ and /v1/."""

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions as drf

from tenants import errors

logger = logging.getLogger(__name__)

JSON_PREFIXES = ("/api/", "/v1/")


def _join(path: str, key) -> str:
    if isinstance(key, int):  # list items: DRF keys their errors by index
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _flatten(detail, path: str = "") -> list[tuple[str, str]]:
    if isinstance(detail, dict):
        return [item for key, value in detail.items() for item in _flatten(value, _join(path, key))]
    if isinstance(detail, list):
        if all(not isinstance(d, (dict, list)) for d in detail):
            return [(path, " ".join(str(d) for d in detail))]
        return [
            item
            for i, value in enumerate(detail)
            if value
            for item in _flatten(value, _join(path, i))
        ]
    return [(path, str(detail))]


def _from_validation(exc: drf.ValidationError) -> errors.InvalidRequest:
    problems = _flatten(exc.detail)
    problems = [(p if p != "non_field_errors" else "", m) for p, m in problems]
    message = "; ".join(f"{p}: {m}" if p else m for p, m in problems) or "Invalid request."
    return errors.InvalidRequest(message, param=next((p for p, _ in problems if p), None))


def as_application_error(exc: Exception) -> errors.ApplicationError | None:
    if isinstance(exc, errors.ApplicationError):
        return exc
    if isinstance(exc, drf.ValidationError):
        return _from_validation(exc)
    if isinstance(exc, drf.ParseError):
        return errors.InvalidRequest(f"Malformed JSON body: {exc.detail}")
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        return errors.AuthenticationFailed(str(exc.detail))
    if isinstance(exc, (drf.PermissionDenied, DjangoPermissionDenied)):
        return errors.PermissionDenied(str(getattr(exc, "detail", "")) or None)
    if isinstance(exc, (drf.NotFound, Http404)):
        return errors.NotFound()
    if isinstance(exc, drf.MethodNotAllowed):
        return errors.MethodNotAllowed(str(exc.detail))
    if isinstance(exc, drf.UnsupportedMediaType):
        return errors.UnsupportedMediaType(str(exc.detail))
    if isinstance(exc, drf.Throttled):
        return errors.RateLimited(retry_after=int(exc.wait or 1))
    if isinstance(exc, errors.DATABASE_TRANSIENT):  # the database blinked: nothing changed
        logger.warning("the database did not answer: %s", type(exc).__name__, exc_info=exc)
        return errors.ServiceUnavailable(retry_after=2)
    return None


def error_response(exc: errors.ApplicationError) -> JsonResponse:
    """The one HTTP rendering of an application error: the OpenAI error body, its status, and
    its headers (Retry-After, x-should-retry, a 401's WWW-Authenticate)."""
    response = JsonResponse(
        errors.error_body_for(exc), status=exc.status, headers=errors.error_headers(exc)
    )
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="fairlane"'
    return response


def exception_handler(exc, context) -> JsonResponse | None:
    """DRF's EXCEPTION_HANDLER: application and DRF errors in the OpenAI error body."""
    app_exc = as_application_error(exc)
    if app_exc is None:
        return None  # a bug: Django's 500 handler answers (below), and logs it
    return error_response(app_exc)


def handler404(request, exception=None):
    if request.path.startswith(JSON_PREFIXES):
        return error_response(errors.NotFound(f"No route for {request.path}."))
    return defaults.page_not_found(request, exception)


def handler500(request):
    if request.path.startswith(JSON_PREFIXES):
        return error_response(errors.ApplicationError())
    return defaults.server_error(request)
