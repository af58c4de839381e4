"""The ops dashboard is for the platform's operators (Django staff): a visitor who is not
signed in is sent to sign in, a signed-in person who is not staff gets 403."""

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.views.decorators.http import require_GET, require_POST

NOT_STAFF = "The ops dashboard is for the platform's operators."


def staff_page(*, write: bool = False):
    """Decorate an ops view; `write`: an action, POST only (CSRF-checked like every form)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not (request.user.is_active and request.user.is_staff):
                raise PermissionDenied(NOT_STAFF)
            return view(request, *args, **kwargs)

        return require_POST(wrapped) if write else require_GET(wrapped)

    return decorator
