"""SCIM filters (`userName eq "ada@acme.example"`, `externalId eq "..."`, `displayName eq`)
turned into SQL by scim2-filter-parser, always within the token's tenant."""

from django_scim.filters import FilterQuery

from tenants.models import Membership, ScimGroup


class _TenantScoped(FilterQuery):
    table = ""

    @classmethod
    def search(cls, filter_query, request=None):
        """The filter's rows of the token's tenant: the filter is parenthesised whole before
        the tenant is added, so an `or` in it can never reach past the tenant."""
        model = cls.model_getter()
        q = cls.query_class(filter_query, cls.table_name(), cls.attr_map, cls.joins)
        if q.where_sql is None:
            return model.objects.none()
        where = q.where_sql.format(**dict.fromkeys(q.params_dict, "%s"))
        sql = (
            f"SELECT DISTINCT {cls.table}.* FROM {cls.table} {' '.join(cls.joins)} "
            f"WHERE ({where}) AND {cls.table}.tenant_id = %s"
        )
        return model.objects.raw(sql, [*q.params, request.scim_tenant.pk])


class UserFilterQuery(_TenantScoped):
    model_getter = staticmethod(lambda: Membership)
    table = "tenants_membership"
    joins = ("JOIN auth_user ON auth_user.id = tenants_membership.user_id",)
    attr_map = {
        ("userName", None, None): "auth_user.username",
        ("externalId", None, None): "tenants_membership.scim_external_id",
        ("name", "familyName", None): "auth_user.last_name",
        ("familyName", None, None): "auth_user.last_name",
        ("name", "givenName", None): "auth_user.first_name",
        ("givenName", None, None): "auth_user.first_name",
        ("emails", "value", None): "auth_user.email",
        ("emails", None, None): "auth_user.email",
        ("active", None, None): "tenants_membership.is_active",
    }


class GroupFilterQuery(_TenantScoped):
    model_getter = staticmethod(lambda: ScimGroup)
    table = "tenants_scimgroup"
    attr_map = {
        ("displayName", None, None): "tenants_scimgroup.display_name",
        ("externalId", None, None): "tenants_scimgroup.scim_external_id",
    }
