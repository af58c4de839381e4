"""The management API: thin views that parse, call one service or selector, and render.

Roles: viewer reads; member also manages API keys; admin also manages agents, budgets and
members; owner also grants the owner role. An API key acts in its own tenant only, as a viewer
(management.read) or an admin (management.write).
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import selectors
from tenants.apis import serializers as s
from tenants.apis.auth import ApiKeyPrincipal, principal_role, tenant_for
from tenants.apis.pagination import StrictLimitOffsetPagination
from tenants.errors import InvalidRequest, NotFound, PermissionDenied
from tenants.models import Role, Scope
from tenants.services import budgets, keys, tenancy
from tenants.services.member_keys import member_keys_fate


def _valid(serializer_class, data, **kwargs) -> dict:
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class ListView(APIView):
    """A view whose GET answers a page (`count`, `next`, `previous`, `results`)."""

    pagination_class = StrictLimitOffsetPagination


def _paginated(view: APIView, request, queryset, out_class, **context) -> Response:
    paginator = StrictLimitOffsetPagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(out_class(page, many=True, context=context).data)


def _with_window(budget):
    budget.current_window = selectors.budget_window_status(budget=budget)
    return budget


class MeView(APIView):
    @extend_schema(responses={200: dict}, summary="Who the credentials belong to")
    def get(self, request):
        if isinstance(request.user, ApiKeyPrincipal):
            key = request.user.api_key
            return Response(
                {
                    "type": "api_key",
                    "key": key.prefix,
                    "tenant": key.tenant.slug,
                    "agent": key.agent.name,
                    "scopes": key.scopes,
                }
            )
        return Response(
            {
                "type": "user",
                "username": request.user.get_username(),
                "is_staff": request.user.is_staff,
            }
        )


class TenantListView(ListView):
    @extend_schema(responses=s.TenantOut(many=True), summary="Tenants you belong to")
    def get(self, request):
        if isinstance(request.user, ApiKeyPrincipal):
            tenant = request.user.api_key.tenant
            roles = {tenant.pk: principal_role(principal=request.user, tenant=tenant)}
            tenants = [tenant]
        else:
            tenants = selectors.tenant_list(user=request.user)
            roles = {m.tenant_id: m.role for m in request.user.memberships.all()}
        return _paginated(self, request, tenants, s.TenantOut, roles=roles)

    @extend_schema(
        request=s.TenantCreateIn,
        responses={201: s.TenantOut},
        summary="Create a tenant (you become its owner)",
    )
    def post(self, request):
        if isinstance(request.user, ApiKeyPrincipal) or not settings.FAIRLANE_SELF_SERVICE_TENANTS:
            raise PermissionDenied(
                "Tenants are created by signed-in people"
                + ("" if settings.FAIRLANE_SELF_SERVICE_TENANTS else " through the admin")
                + "."
            )
        data = _valid(s.TenantCreateIn, request.data)
        tenant = tenancy.tenant_create(
            name=data["name"],
            slug=data["slug"],
            owner=request.user,
            timezone_name=data["timezone"],
            default_lane=data["default_lane"],
        )
        return Response(
            s.TenantOut(tenant, context={"roles": {tenant.pk: Role.OWNER}}).data,
            status=status.HTTP_201_CREATED,
        )


class TenantDetailView(APIView):
    @extend_schema(responses=s.TenantOut)
    def get(self, request, slug):
        tenant, role = tenant_for(principal=request.user, slug=slug)
        return Response(s.TenantOut(tenant, context={"roles": {tenant.pk: role}}).data)

    @extend_schema(request=s.TenantUpdateIn, responses=s.TenantOut)
    def patch(self, request, slug):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        tenant = tenancy.tenant_update(
            tenant=tenant, actor_role=role, **_valid(s.TenantUpdateIn, request.data)
        )
        return Response(s.TenantOut(tenant, context={"roles": {tenant.pk: role}}).data)


class MemberListView(ListView):
    @extend_schema(responses=s.MemberOut(many=True))
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        return _paginated(self, request, selectors.membership_list(tenant=tenant), s.MemberOut)

    @extend_schema(request=s.MemberAddIn, responses={201: s.MemberOut})
    def post(self, request, slug):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        data = _valid(s.MemberAddIn, request.data)
        user = get_user_model().objects.filter(username=data["username"], is_active=True).first()
        if user is None:  # a reference to nobody: 404, like an unknown agent id
            raise NotFound("No active user with that username.", param="username")
        membership = tenancy.member_add(
            tenant=tenant, user=user, role=data["role"], actor_role=role
        )
        return Response(s.MemberOut(membership).data, status=status.HTTP_201_CREATED)


class MemberDetailView(APIView):
    @extend_schema(responses=s.MemberDetailOut)
    def get(self, request, slug, member_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        membership = selectors.membership_get_by_id(tenant=tenant, membership_id=member_id)
        fates = member_keys_fate(tenant=tenant, user=membership.user, role=None)
        return Response(s.MemberDetailOut(membership, context={"fates": fates}).data)

    @extend_schema(request=s.MemberUpdateIn, responses=s.MemberOut)
    def patch(self, request, slug, member_id):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        membership = selectors.membership_get_by_id(tenant=tenant, membership_id=member_id)
        membership = tenancy.member_update(
            membership=membership, actor_role=role, **_valid(s.MemberUpdateIn, request.data)
        )
        return Response(s.MemberOut(membership).data)

    @extend_schema(
        responses={204: None},
        description=(
            "Remove the member. The keys they made are revoked, or, for inference-only keys where "
            "the tenant's departed_member_keys is hand_over, stay with their agent; GET the member "
            "first to see which (keys_on_removal)."
        ),
    )
    def delete(self, request, slug, member_id):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        membership = selectors.membership_get_by_id(tenant=tenant, membership_id=member_id)
        tenancy.member_remove(membership=membership, actor_role=role)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AgentListView(ListView):
    @extend_schema(responses=s.AgentOut(many=True))
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        return _paginated(self, request, selectors.agent_list(tenant=tenant), s.AgentOut)

    @extend_schema(request=s.AgentCreateIn, responses={201: s.AgentOut})
    def post(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        agent = tenancy.agent_create(tenant=tenant, **_valid(s.AgentCreateIn, request.data))
        return Response(s.AgentOut(agent).data, status=status.HTTP_201_CREATED)


class AgentDetailView(APIView):
    @extend_schema(responses=s.AgentOut)
    def get(self, request, slug, agent_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        return Response(s.AgentOut(selectors.agent_get(tenant=tenant, agent_id=agent_id)).data)

    @extend_schema(request=s.AgentUpdateIn, responses=s.AgentOut)
    def patch(self, request, slug, agent_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        agent = selectors.agent_get(tenant=tenant, agent_id=agent_id)
        agent = tenancy.agent_update(agent=agent, **_valid(s.AgentUpdateIn, request.data))
        return Response(s.AgentOut(agent).data)

    @extend_schema(responses={200: s.AgentOut}, summary="Deactivate an agent and revoke its keys")
    def delete(self, request, slug, agent_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        agent = tenancy.agent_deactivate(
            agent=selectors.agent_get(tenant=tenant, agent_id=agent_id)
        )
        return Response(s.AgentOut(agent).data)


class KeyListView(ListView):
    @extend_schema(
        responses=s.KeyOut(many=True),
        parameters=[OpenApiParameter("agent", OpenApiTypes.UUID, description="agent id")],
    )
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        agent = _usage_filters(request, tenant).get("agent")
        return _paginated(
            self, request, selectors.api_key_list(tenant=tenant, agent=agent), s.KeyOut
        )

    @extend_schema(
        request=s.KeyCreateIn,
        responses={201: s.KeyCreatedOut},
        summary="Create a key; the response is the only time the key is shown",
    )
    def post(self, request, slug):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.MEMBER)
        data = _valid(s.KeyCreateIn, request.data)
        agent = selectors.agent_get(tenant=tenant, agent_id=data["agent"])
        key, plain = keys.api_key_create(
            tenant=tenant,
            agent=agent,
            name=data["name"],
            scopes=data.get("scopes") or [Scope.INFERENCE.value],
            expires_at=data["expires_at"],
            created_by=_person(request),
            actor_role=role,
            **{k: data[k] for k in ("rpm_limit", "tpm_limit", "concurrency_limit") if k in data},
        )
        key.key = plain
        response = Response(s.KeyCreatedOut(key).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


def _person(request):
    """Who a new key is made by: the signed-in person, or the person who made the key the
    request came with (so a key minted by a key still follows that person's fate)."""
    if isinstance(request.user, ApiKeyPrincipal):
        return request.user.api_key.created_by
    return request.user


class KeyDetailView(APIView):
    @extend_schema(responses=s.KeyOut)
    def get(self, request, slug, key_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        return Response(s.KeyOut(selectors.api_key_get(tenant=tenant, key_id=key_id)).data)

    @extend_schema(responses={200: s.KeyOut}, summary="Revoke a key at once")
    def delete(self, request, slug, key_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.MEMBER)
        key = keys.api_key_revoke(key=selectors.api_key_get(tenant=tenant, key_id=key_id))
        return Response(s.KeyOut(key).data)


class KeyRotateView(APIView):
    @extend_schema(
        request=s.KeyRotateIn,
        responses={201: s.KeyCreatedOut},
        summary="Replace a key; the old one works for grace_seconds more",
    )
    def post(self, request, slug, key_id):
        tenant, role = tenant_for(principal=request.user, slug=slug, min_role=Role.MEMBER)
        old = selectors.api_key_get(tenant=tenant, key_id=key_id)
        data = _valid(s.KeyRotateIn, request.data)
        key, plain = keys.api_key_rotate(
            key=old,
            grace_seconds=data["grace_seconds"],
            created_by=_person(request),
            actor_role=role,
        )
        key.key = plain
        response = Response(s.KeyCreatedOut(key).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class BudgetListView(ListView):
    @extend_schema(responses=s.BudgetOut(many=True))
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        budget_list = [_with_window(b) for b in selectors.budget_list(tenant=tenant)]
        return _paginated(self, request, budget_list, s.BudgetOut)

    @extend_schema(
        request=s.BudgetCreateIn,
        responses={201: s.BudgetOut},
        summary="Set a budget for an agent, an API key, a member, or the tenant (none of "
        "them), for every model or a list",
    )
    def post(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        data = _valid(s.BudgetCreateIn, request.data)
        agent = (
            selectors.agent_get(tenant=tenant, agent_id=data["agent"]) if data["agent"] else None
        )
        api_key = (
            selectors.api_key_get(tenant=tenant, key_id=data["api_key"])
            if data["api_key"]
            else None
        )
        member = (
            selectors.membership_get_by_id(tenant=tenant, membership_id=data["member"])
            if data["member"] is not None
            else None
        )
        soft = {f: data[f] for f in budgets.SOFT_FIELDS if f in data}
        budget = budgets.budget_create(
            tenant=tenant,
            agent=agent,
            api_key=api_key,
            member=member,
            model_names=data["models"],
            period=data["period"],
            limit_microcents=data["limit_microcents"],
            **soft,
        )
        return Response(s.BudgetOut(_with_window(budget)).data, status=status.HTTP_201_CREATED)


class BudgetDetailView(APIView):
    @extend_schema(responses=s.BudgetOut)
    def get(self, request, slug, budget_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        budget = selectors.budget_get(tenant=tenant, budget_id=budget_id)
        return Response(s.BudgetOut(_with_window(budget)).data)

    @extend_schema(request=s.BudgetUpdateIn, responses=s.BudgetOut)
    def patch(self, request, slug, budget_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        budget = selectors.budget_get(tenant=tenant, budget_id=budget_id)
        budget = budgets.budget_update(budget=budget, **_valid(s.BudgetUpdateIn, request.data))
        return Response(s.BudgetOut(_with_window(budget)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, slug, budget_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        budgets.budget_delete(budget=selectors.budget_get(tenant=tenant, budget_id=budget_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _usage_filters(request, tenant) -> dict:
    query = _valid(s.UsageQueryIn, request.query_params.dict())
    if "agent" in query:
        query["agent"] = selectors.agent_get(tenant=tenant, agent_id=query["agent"])
    if "api_key" in query:
        query["api_key"] = selectors.api_key_get(tenant=tenant, key_id=query["api_key"])
    if "member" in query:
        query["member"] = selectors.membership_get_by_id(
            tenant=tenant, membership_id=query["member"]
        )
    if query.get("since") and query.get("until") and query["since"] >= query["until"]:
        raise InvalidRequest("since must be before until.", param="since")
    return query


USAGE_PARAMETERS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME),
    OpenApiParameter("until", OpenApiTypes.DATETIME),
    OpenApiParameter("agent", OpenApiTypes.UUID, description="agent id"),
    OpenApiParameter("api_key", OpenApiTypes.UUID, description="API key id"),
    OpenApiParameter("member", OpenApiTypes.INT, description="membership id: their keys"),
    OpenApiParameter("model", OpenApiTypes.STR, description="model name"),
]
SUMMARY_PARAMETERS = [
    *USAGE_PARAMETERS,
    OpenApiParameter(
        "group_by",
        OpenApiTypes.STR,
        description="comma list of agent, api_key, member, model (default agent,model)",
    ),
]


class UsageListView(ListView):
    @extend_schema(responses=s.UsageOut(many=True), parameters=USAGE_PARAMETERS)
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        records = selectors.usage_list(tenant=tenant, **_usage_filters(request, tenant))
        return _paginated(self, request, records, s.UsageOut)


class UsageSummaryView(APIView):
    @extend_schema(responses=s.UsageSummaryListOut, parameters=SUMMARY_PARAMETERS)
    def get(self, request, slug):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        query = _usage_filters(request, tenant)
        group_by = [g for g in query.pop("group_by", "agent,model").split(",") if g]
        if not group_by or set(group_by) - set(selectors.USAGE_GROUPS):
            raise InvalidRequest(
                f"group_by must be a comma list of {', '.join(selectors.USAGE_GROUPS)}.",
                param="group_by",
            )
        rows = selectors.usage_summary(tenant=tenant, group_by=group_by, **query)
        return Response({"results": s.UsageSummaryOut(rows, many=True).data})
