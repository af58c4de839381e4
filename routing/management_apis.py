"""The management API's routing part (under /api/): the backends a tenant's agents can be
routed to (names, kinds, models, prices, health; never URLs or credentials, which are the
operator's), and each agent's routing: its fall-through chain, policy and cascade. Reading
needs the viewer role in the tenant, changing needs admin, like the agent itself."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from routing.backend_store import agent_routing_set
from routing.models import AgentRouting, Backend, Policy
from tenants import selectors
from tenants.apis.auth import tenant_for
from tenants.apis.serializers import StrictCharField, StrictChoiceField, StrictSerializer
from tenants.models import Role, name_validator


class BackendModelOut(serializers.Serializer):
    model = serializers.CharField()
    price_input_per_mtok = serializers.IntegerField()
    price_output_per_mtok = serializers.IntegerField()
    price_cached_per_mtok = serializers.IntegerField()


class BackendOut(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    health = serializers.SerializerMethodField()
    probe_p95_ms = serializers.FloatField()
    context_length = serializers.IntegerField()
    hidden_states = serializers.BooleanField()
    accelerator = serializers.CharField()
    zone = serializers.CharField()
    energy_mj_per_token = serializers.IntegerField()
    carbon_g_per_kwh = serializers.IntegerField()
    models = BackendModelOut(many=True, source="models.all")

    def get_health(self, backend: Backend) -> str:
        return backend.health_at(timezone.now())


class StrictFloatField(serializers.FloatField):
    """JSON numbers only (DRF would take true and "0.5")."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class RoutingSerializer(StrictSerializer):
    chain = serializers.ListField(
        child=StrictCharField(max_length=100, validators=[name_validator]),
        max_length=50,
        required=False,
        default=list,
    )
    policy = StrictChoiceField(choices=Policy.choices, required=False, default=Policy.CHAIN)
    cascade = serializers.ListField(
        child=StrictCharField(max_length=200, validators=[name_validator]),
        max_length=8,
        required=False,
        default=list,
    )
    cascade_threshold = StrictFloatField(required=False, default=-1.0, min_value=-100, max_value=0)


class BackendListView(APIView):
    @extend_schema(
        responses=BackendOut(many=True),
        summary="Backends requests can be routed to (operators register them)",
    )
    def get(self, request):
        rows = Backend.objects.filter(is_enabled=True).prefetch_related("models")
        return Response(BackendOut(rows, many=True).data)


class AgentRoutingView(APIView):
    @extend_schema(responses=RoutingSerializer)
    def get(self, request, slug, agent_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug)
        agent = selectors.agent_get(tenant=tenant, agent_id=agent_id)
        row = AgentRouting.objects.filter(agent=agent).first() or AgentRouting(agent=agent)
        return Response(RoutingSerializer(row).data)

    @extend_schema(
        request=RoutingSerializer,
        responses=RoutingSerializer,
        summary="Set the agent's chain, policy and cascade",
    )
    def put(self, request, slug, agent_id):
        tenant, _ = tenant_for(principal=request.user, slug=slug, min_role=Role.ADMIN)
        agent = selectors.agent_get(tenant=tenant, agent_id=agent_id)
        serializer = RoutingSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        row = agent_routing_set(agent=agent, **serializer.validated_data)
        return Response(RoutingSerializer(row).data)
