"""django-scim2's adapters for Fairlane: a SCIM User is a membership in the token's tenant
(the person's account, their role's groups, `active` the membership's), a SCIM Group a
ScimGroup of that tenant. Reads come from the rows; every write goes to tenants.services.scim.
PATCH takes what Okta and Entra ID send: a path and a value, or no path and a dict of
attributes; booleans also as the strings "True"/"False" (Entra)."""

from __future__ import annotations

import re
import uuid
from contextlib import contextmanager
from urllib.parse import urljoin

from django.urls import reverse
from django_scim import exceptions
from django_scim.adapters import SCIMGroup, SCIMUser
from django_scim.constants import SchemaURI
from django_scim.models import SCIMServiceProviderConfig

from tenants.errors import ApplicationError, InvalidRequest, NotFound
from tenants.models import Membership
from tenants.scim.filters import GroupFilterQuery, UserFilterQuery
from tenants.services import scim
from tenants.services.scim import ScimUserFields
from tenants.services.validation import Conflict

_MEMBER_FILTER = re.compile(r'^members\[value eq "([^"]+)"\]$', re.IGNORECASE)


def membership_model():
    return Membership


def base_location(request=None, *args, **kwargs) -> str:
    return request.build_absolute_uri("/") if request is not None else "/"


def tenant_filter_getter(model):
    def extra(request, *args, **kwargs):
        if args and not _is_uuid(args[0]):
            raise exceptions.NotFoundError(args[0])
        return {"tenant_id": request.scim_tenant.pk}

    return extra


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


@contextmanager
def scim_errors():
    """The services' errors in SCIM's shape (RFC 7644 3.12)."""
    try:
        yield
    except Conflict as exc:
        raise exceptions.IntegrityError(exc.message, scim_type="uniqueness") from None
    except NotFound as exc:
        raise exceptions.NotFoundError(exc.message) from None
    except InvalidRequest as exc:
        raise exceptions.BadRequestError(exc.message, scim_type="invalidValue") from None
    except ApplicationError as exc:
        raise exceptions.BadRequestError(exc.message) from None


def _boolean(value, name: str) -> bool:
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise exceptions.BadRequestError(f'"{name}" must be a boolean.', scim_type="invalidValue")
    return value


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise exceptions.BadRequestError(f'"{name}" must be a string.', scim_type="invalidValue")
    return value


def _primary_email(value) -> str:
    if isinstance(value, dict):  # OneLogin sends one address as an object
        value = [value]
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise exceptions.BadRequestError('"emails" must be a list.', scim_type="invalidValue")
    ordered = sorted(value, key=lambda e: not e.get("primary"))
    return _text(ordered[0].get("value", ""), "emails.value") if ordered else ""


def _meta(resource_type: str, obj, location: str) -> dict:
    created = obj.created_at.isoformat() if obj.created_at else None
    return {
        "resourceType": resource_type,
        "created": created,
        "lastModified": created,
        "location": location,
    }


class ScimUser(SCIMUser):
    id_field = "scim_id"
    ATTR_MAP = UserFilterQuery.attr_map

    def __init__(self, obj, request=None):
        super().__init__(obj, request)
        self.fields = ScimUserFields()

    @property
    def location(self):
        return urljoin(base_location(self.request), self.path)

    @property
    def display_name(self):
        user = self.obj.user
        return user.get_full_name() or user.username

    def to_dict(self):
        user = self.obj.user
        data = {
            "schemas": [SchemaURI.USER],
            "id": self.id,
            "userName": user.username,
            "name": {
                "givenName": user.first_name,
                "familyName": user.last_name,
                "formatted": self.display_name,
            },
            "displayName": self.display_name,
            "emails": (
                [{"value": user.email, "primary": True, "type": "work"}] if user.email else []
            ),
            "active": self.obj.is_active,
            "groups": [
                {
                    "value": str(g.scim_id),
                    "display": g.display_name,
                    "$ref": urljoin(
                        base_location(self.request),
                        reverse("scim:groups", kwargs={"uuid": g.scim_id}),
                    ),
                }
                for g in self.obj.scim_groups.all()
            ],
            "meta": _meta("User", self.obj, self.location),
        }
        if self.obj.scim_external_id:
            data["externalId"] = self.obj.scim_external_id
        return data

    def _set(self, path: str, value) -> None:
        key = path.strip().lower()
        if key == "active":
            self.fields.active = _boolean(value, "active")
        elif key == "username":
            self.fields.user_name = _text(value, "userName").strip()
        elif key == "externalid":
            self.fields.external_id = "" if value is None else _text(value, "externalId")
        elif key in ("name.givenname", "givenname"):
            self.fields.given_name = _text(value or "", "name.givenName")
        elif key in ("name.familyname", "familyname"):
            self.fields.family_name = _text(value or "", "name.familyName")
        elif key == "name":
            for part, sub in (("givenName", "name.givenName"), ("familyName", "name.familyName")):
                if part in (value or {}):
                    self._set(sub, value[part])
        elif key == "emails" or key.startswith("emails["):
            self.fields.email = _primary_email(value) if key == "emails" else _text(value, key)
        # displayName, title, locale...: not kept (the account's name is kept in `name`)

    def validate_dict(self, d):
        if not isinstance(d, dict):
            raise exceptions.BadRequestError("The body must be a JSON object.")

    def from_dict(self, d):
        for key in ("userName", "externalId", "name", "emails", "active"):
            if key in d:
                self._set(key, d[key])

    def save(self):
        with scim_errors():
            if self.obj.pk is None:
                self.obj = scim.scim_user_create(
                    tenant=self.request.scim_tenant, fields=self.fields
                )
            else:
                scim.scim_user_update(membership=self.obj, fields=self.fields)
        self.fields = ScimUserFields()

    def delete(self):
        with scim_errors():
            scim.scim_user_delete(membership=self.obj)

    def handle_operations(self, operations):
        for operation in operations:
            op = str(operation.get("op", "")).lower()
            path, value = operation.get("path"), operation.get("value")
            if op not in ("add", "replace", "remove"):
                raise exceptions.BadRequestError(f'Unknown PATCH op "{op}"')
            if op == "remove":
                if not path:
                    raise exceptions.BadRequestError('"remove" needs a path.', scim_type="noTarget")
                self._set(path, None if path.lower() == "externalid" else "")
            elif path:
                self._set(path, value)
            elif isinstance(value, dict):
                for key, item in value.items():
                    self._set(key, item)
            else:
                raise exceptions.BadRequestError("A PATCH without a path needs an object value.")
        self.save()


class ScimGroupAdapter(SCIMGroup):
    id_field = "scim_id"
    ATTR_MAP = GroupFilterQuery.attr_map

    @property
    def location(self):
        return urljoin(base_location(self.request), self.path)

    @property
    def display_name(self):
        return self.obj.display_name

    def to_dict(self):
        data = {
            "schemas": [SchemaURI.GROUP],
            "id": self.id,
            "displayName": self.obj.display_name,
            "members": [
                {
                    "value": str(m.scim_id),
                    "display": m.user.username,
                    "$ref": urljoin(
                        base_location(self.request),
                        reverse("scim:users", kwargs={"uuid": m.scim_id}),
                    ),
                }
                for m in self.obj.members.select_related("user")
            ]
            if self.obj.pk
            else [],
            "meta": _meta("Group", self.obj, self.location),
        }
        if self.obj.scim_external_id:
            data["externalId"] = self.obj.scim_external_id
        return data

    def _members(self, value) -> list[Membership]:
        if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
            raise exceptions.BadRequestError('"members" must be a list.', scim_type="invalidValue")
        ids = [str(m.get("value", "")) for m in value]
        if not all(_is_uuid(i) for i in ids):
            raise exceptions.BadRequestError("members: unknown user.", scim_type="invalidValue")
        found = list(Membership.objects.filter(tenant=self.request.scim_tenant, scim_id__in=ids))
        if len(found) != len(set(ids)):
            raise exceptions.BadRequestError("members: unknown user.", scim_type="invalidValue")
        return found

    def validate_dict(self, d):
        if not isinstance(d, dict):
            raise exceptions.BadRequestError("The body must be a JSON object.")

    def from_dict(self, d):
        self.new_name = _text(d["displayName"], "displayName") if "displayName" in d else None
        self.new_external_id = d.get("externalId") if "externalId" in d else None
        self.new_members = self._members(d.get("members") or [])

    def save(self):
        if self.obj.pk is None:
            self.obj.tenant = self.request.scim_tenant
        with scim_errors():
            self.obj = scim.scim_group_save(
                group=self.obj,
                display_name=self.new_name,
                external_id=self.new_external_id,
                members=self.new_members,
            )

    def delete(self):
        with scim_errors():
            scim.scim_group_delete(group=self.obj)

    def handle_operations(self, operations):
        add, remove, name = [], [], None
        for operation in operations:
            op = str(operation.get("op", "")).lower()
            path, value = (operation.get("path") or ""), operation.get("value")
            match = _MEMBER_FILTER.match(path)
            if op == "remove" and match:
                remove += self._members([{"value": match.group(1)}])
            elif path.lower() == "members" and op in ("add", "remove"):
                (add if op == "add" else remove).extend(self._members(value))
            elif path.lower() == "members" and op == "replace":
                remove += list(self.obj.members.all())
                add += self._members(value)
            elif op in ("add", "replace") and (
                path.lower() == "displayname" or (not path and isinstance(value, dict))
            ):
                fields = value if not path else {"displayName": value}
                name = _text(fields.get("displayName", self.obj.display_name), "displayName")
                if "members" in fields:
                    remove += list(self.obj.members.all())
                    add += self._members(fields["members"])
            else:
                raise exceptions.NotImplementedError(f"PATCH {op} {path or '(no path)'}")
        with scim_errors():
            if name is not None:
                scim.scim_group_save(
                    group=self.obj, display_name=name, external_id=None, members=None
                )
            scim.scim_group_members_change(
                group=self.obj, add=add, remove=[m for m in remove if m not in add]
            )


class ServiceProviderConfig(SCIMServiceProviderConfig):
    """What this service provider supports (RFC 7643 section 5)."""

    def to_dict(self):
        return {
            "schemas": [SchemaURI.SERVICE_PROVIDER_CONFIG],
            "documentationUri": None,
            "patch": {"supported": True},
            "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
            "filter": {"supported": True, "maxResults": 50},
            "changePassword": {"supported": False},
            "sort": {"supported": False},
            "etag": {"supported": False},
            "authenticationSchemes": [
                {
                    "type": "oauthbearertoken",
                    "name": "Bearer token",
                    "description": "A tenant's SCIM token, made on the portal's Sign-in page.",
                    "primary": True,
                }
            ],
            "meta": self.meta,
        }
