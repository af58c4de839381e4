from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, models, transaction

from tenants.errors import InvalidRequest


def invalid_from_validation_error(exc: ValidationError,
                                  unique_param: str | None = None) -> InvalidRequest:
    if hasattr(exc, "error_dict"):
        field, errors = next(iter(exc.error_dict.items()))
        message = " ".join(m for e in errors for m in e.messages)
        # Unique constraints over several fields report as non-field errors.
        param = unique_param if field == NON_FIELD_ERRORS else field
        return InvalidRequest(f"{param}: {message}" if param else message, param=param)
    return InvalidRequest(" ".join(exc.messages))


def save_validated(obj: models.Model, *, unique_param: str | None = None) -> models.Model:
    """Validate a model instance (field rules and unique constraints) and save it; failures
    become InvalidRequest naming the field."""
    try:
        obj.full_clean()
        with transaction.atomic():
            obj.save()
    except ValidationError as exc:
        raise invalid_from_validation_error(exc, unique_param) from None
    except IntegrityError:
        # A concurrent writer won the unique constraint that full_clean checked.
        raise InvalidRequest(f"{unique_param or 'object'} already exists.",
                             param=unique_param) from None
    return obj
