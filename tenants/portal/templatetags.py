"""Template filters of the portal (loaded as {% load portal %})."""

from decimal import Decimal

from django import template

from tenants.models import MICROCENTS_PER_USD

register = template.Library()


@register.filter
def usd(microcents) -> str:
    """Micro-cents as dollars: $12.34, and small amounts with the digits that matter."""
    if microcents is None or microcents == "":
        return "—"
    amount = Decimal(int(microcents)) / MICROCENTS_PER_USD
    if amount == 0:
        return "$0.00"
    if abs(amount) >= Decimal("0.01"):
        return f"${amount:,.2f}"
    return f"${amount:.8f}".rstrip("0")
