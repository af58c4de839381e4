"""Recompute every budget window's spent and reserved from the ledger and the open holds, and
report each difference with the rows behind it (docs/api.md, "Reconciliation"). Nothing is
changed without --fix; each correction is audited. Exit status 1 when differences were found
and left as they were, 2 for an unknown tenant."""

import json

from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services.budget_reconcile import WindowCheck, budget_windows_reconcile


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--tenant", metavar="SLUG", help="only this tenant's budgets")
        parser.add_argument("--fix", action="store_true", help="correct the windows that differ")
        parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")

    def handle(self, *args, **options):
        tenant, scope = options["tenant"], None
        if tenant is not None:
            scope = Tenant.objects.filter(slug=tenant).first()
            if scope is None:
                raise CommandError(f"no tenant with the slug {tenant!r}", returncode=2)
        report = budget_windows_reconcile(tenant=scope, fix=options["fix"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_json(), indent=2))
        else:
            for check in report.differences:
                self.stdout.write(_line(check))
            self.stdout.write(
                f"checked {report.windows_checked} windows: {len(report.differences)} differ, "
                f"{len(report.differences) - len(report.unfixed)} corrected"
            )
        if report.unfixed:
            raise CommandError(
                f"{len(report.unfixed)} windows differ from the ledger (--fix corrects them)",
                returncode=1,
            )


def _line(check: WindowCheck) -> str:
    spent = (
        f"spent {check.spent_stored} -> {check.spent_recomputed}"
        if check.spent_recomputed is not None
        else f"spent {check.spent_stored} (not checked: overlapping windows)"
    )
    return (
        f"{check.tenant}/{check.owner} {check.period} window {check.window_id} "
        f"[{check.start:%Y-%m-%d %H:%M}, {check.end:%Y-%m-%d %H:%M}): {spent}, "
        f"reserved {check.reserved_stored} -> {check.reserved_recomputed}"
        f"{' (corrected)' if check.fixed else ''}; "
        f"ledger rows {list(check.usage_ids)}, holds {[str(i) for i in check.reservation_ids]}"
    )
