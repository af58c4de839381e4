"""Lists page with `limit` and `offset`, which must be integers (limit at least 1, offset at
least 0): anything else is a 400 naming the parameter, where DRF's own paginator would
silently ignore it. The schema says the same."""

from rest_framework.pagination import LimitOffsetPagination

from tenants.errors import InvalidRequest

MAX_QUERY_INT = 2**31 - 1


class StrictLimitOffsetPagination(LimitOffsetPagination):
    def _strict(self, request, name: str, *, low: int, default):
        raw = request.query_params.get(name)
        if raw is None:
            return default
        if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= MAX_QUERY_INT:
            raise InvalidRequest(
                f"'{name}' must be an integer from {low} to {MAX_QUERY_INT}.", param=name
            )
        return int(raw)

    def get_limit(self, request):
        return self._strict(request, self.limit_query_param, low=1, default=self.default_limit)

    def get_offset(self, request):
        return self._strict(request, self.offset_query_param, low=0, default=0)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            low = 1 if parameter["name"] == self.limit_query_param else 0
            parameter["schema"].update(minimum=low, maximum=MAX_QUERY_INT)
        return parameters
