"""Who may see and do what in the portal: the tenant comes from the URL, the role from the
signed-in person's membership. A tenant they are not in is a 404, exactly like one that does
not exist; too low a role, or a write to a suspended tenant, is a 403 (also when a hidden
button's form is posted by hand)."""

from dataclasses import dataclass
from functools import wraps
from zoneinfo import ZoneInfo

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils import timezone
from django.views.decorators.http import require_POST

from tenants import errors, selectors
from tenants.models import ROLE_RANK, Membership, Role, Tenant
from tenants.services.sessions import SSO_REQUIRED, tenant_needs_sso

SUSPENDED = (
    "This tenant is suspended by the platform's operators: the portal is read-only "
    "and its API keys are refused."
)


@dataclass(frozen=True, slots=True)
class Portal:
    tenant: Tenant
    membership: Membership

    @property
    def role(self) -> str:
        return self.membership.role

    def at_least(self, role: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]

    @property
    def read_only_reason(self) -> str:
        return "" if self.tenant.is_active else SUSPENDED

    def can(self, role: str) -> bool:
        """Whether this person may change what `role` may change, right now."""
        return self.tenant.is_active and self.at_least(role)

    @property
    def can_keys(self) -> bool:
        return self.can(Role.MEMBER)

    @property
    def can_admin(self) -> bool:
        return self.can(Role.ADMIN)


def portal_resolve(*, user, slug: str) -> Portal:
    tenant = selectors.tenant_get(slug=slug)
    membership = selectors.membership_get(tenant=tenant, user=user) if tenant else None
    if tenant is None or membership is None:
        raise Http404("No such tenant.")
    if tenant_needs_sso(tenant=tenant, user=user):
        raise PermissionDenied(SSO_REQUIRED)
    return Portal(tenant=tenant, membership=membership)


def portal_page(min_role: str = Role.VIEWER, *, write: bool = False, form: bool = False):
    """Decorate a view taking (request, portal, ...). `write`: an action, POST only; `form`:
    a page whose POST is a write. Writes are refused for a suspended tenant; application
    errors the view lets escape become 404 / 403."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, slug: str, *args, **kwargs):
            portal = portal_resolve(user=request.user, slug=slug)
            writes = write or (form and request.method == "POST")
            if writes and not portal.tenant.is_active:
                raise PermissionDenied(SUSPENDED)
            if not portal.at_least(min_role):
                raise PermissionDenied(
                    f"This needs the {min_role} role or higher in "
                    f"{portal.tenant.slug}; yours is {portal.role}."
                )
            request.portal = portal
            try:
                # Times on the tenant's pages read in the tenant's zone, as its windows do.
                with timezone.override(ZoneInfo(portal.tenant.timezone)):
                    return view(request, portal, *args, **kwargs)
            except errors.NotFound as exc:
                raise Http404(exc.message) from None
            except errors.PermissionDenied as exc:
                raise PermissionDenied(exc.message) from None

        wrapped = login_required(wrapped)
        return require_POST(wrapped) if write else wrapped

    return decorator
