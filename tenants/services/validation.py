import logging
from typing import TypeVar

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, connection, models, transaction

from tenants.errors import ApplicationError, InvalidRequest

M = TypeVar("M", bound=models.Model)

logger = logging.getLogger(__name__)

# SQLSTATE classes of integrity violations (PostgreSQL; SQLite's messages are mapped below).
UNIQUE, FOREIGN_KEY = "23505", "23503"


class Conflict(InvalidRequest):
    """The write conflicts with what exists: a name or owner already taken, or what it
    refers to was just removed (HTTP 409, as conflicts with the current state are). Still an
    InvalidRequest, so callers that catch those (forms) show it the same way."""

    code, status = "conflict", 409
    default_message = "The request conflicts with a concurrent change; read again and retry."


UNIQUE_CODES = {"unique", "unique_together"}


def invalid_from_validation_error(
    exc: ValidationError, unique_param: str | None = None, noun: str = ""
) -> ApplicationError:
    """The field's problem as a 400 naming it; a value already taken is a 409 conflict, said
    in words (Django's "Agent with this Tenant and Name already exists." names columns)."""
    if hasattr(exc, "error_dict"):
        field, errors = next(iter(exc.error_dict.items()))
        message = " ".join(m for e in errors for m in e.messages)
        # Unique constraints over several fields report as non-field errors.
        param = unique_param if field == NON_FIELD_ERRORS else field
        if any(e.code in UNIQUE_CODES for e in errors):
            taken = f"Another {noun} already has this {param}." if noun and param else message
            return Conflict(f"{param}: {taken}" if param else taken, param=param)
        text = f"{param}: {message}" if param else message
        return InvalidRequest(text, param=param)
    return InvalidRequest(" ".join(exc.messages))


def integrity_kind(exc: IntegrityError) -> str:
    """Which constraint a write broke: UNIQUE, FOREIGN_KEY, or another SQLSTATE."""
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None)
    if state:
        return state
    text = str(cause or exc).upper()  # SQLite names the constraint in its message
    if "UNIQUE" in text:
        return UNIQUE
    if "FOREIGN KEY" in text:
        return FOREIGN_KEY
    return "23000"


def error_from_integrity(
    exc: IntegrityError, obj: models.Model, unique_param: str | None
) -> ApplicationError:
    """What the client is told when a write that passed validation still broke a constraint:
    a concurrent writer won a unique constraint (409, as validation says it), or something it
    refers to was deleted meanwhile (409); anything else is our fault (500, logged)."""
    kind = integrity_kind(exc)
    name = type(obj).__name__
    if kind == UNIQUE:
        param = unique_param or "object"
        return Conflict(
            f"{param}: Another {obj._meta.verbose_name} already has this {param}.",
            param=unique_param,
        )
    if kind == FOREIGN_KEY:
        logger.info("%s write lost a race with a deletion: %s", name, exc)
        return Conflict(
            f"This {name.lower()} refers to something that was just removed; "
            "read it again and retry."
        )
    logger.error("%s write broke a constraint that validation passed", name, exc_info=exc)
    return ApplicationError()


def save_validated(obj: M, *, unique_param: str | None = None) -> M:
    """Validate a model instance (field rules and unique constraints) and save it; failures
    become InvalidRequest naming the field (Conflict when it lost a race with a deletion)."""
    try:
        obj.full_clean()
        with transaction.atomic():
            obj.save()
            if connection.vendor == "postgresql":
                # Foreign keys are checked at commit; inside a caller's transaction (a change
                # and its audit record) that is after this function: check them now.
                connection.check_constraints()
    except ValidationError as exc:
        raise invalid_from_validation_error(
            exc, unique_param, str(obj._meta.verbose_name)
        ) from None
    except IntegrityError as exc:
        raise error_from_integrity(exc, obj, unique_param) from None
    return obj
