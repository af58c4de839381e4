"""The ledger row says which trace the request belonged to, which model version answered, and
when each of its steps happened; the settlement function (migration 0005's) takes them."""

from importlib import import_module

from django.db import migrations, models

_0005 = import_module("tenants.migrations.0005_budget_functions")

OLD = """DROP FUNCTION IF EXISTS fairlane_budget_settle(varchar, bigint, bigint, varchar, varchar,
    integer, integer, integer, integer, varchar, timestamptz);"""
NEW = """DROP FUNCTION IF EXISTS fairlane_budget_settle(varchar, bigint, bigint, varchar, varchar,
    integer, integer, integer, integer, varchar, timestamptz, varchar, varchar, jsonb);"""
SETTLE = (_0005.SETTLE
          .replace("p_status varchar, p_now timestamptz,",
                   "p_status varchar, p_now timestamptz, p_trace varchar, p_version varchar,\n"
                   "    p_timeline jsonb,")
          .replace("unbilled_microcents, latency_ms, status, created_at)",
                   "unbilled_microcents, latency_ms, status, created_at, trace_id, model_version,\n"
                   "        timeline)")
          .replace("p_cost - charge, p_latency, p_status, p_now)",
                   "p_cost - charge, p_latency, p_status, p_now, p_trace, p_version, p_timeline)"))
assert SETTLE.count("p_trace") == 2 and SETTLE.count("p_timeline") == 2


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_budget_functions'),
    ]

    operations = [
        migrations.AddField(
            model_name='usagerecord',
            name='model_version',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='usagerecord',
            name='timeline',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='usagerecord',
            name='trace_id',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddIndex(
            model_name='usagerecord',
            index=models.Index(condition=models.Q(('trace_id', ''), _negated=True), fields=['trace_id'], name='usage_trace'),
        ),
        migrations.RunPython(_0005._run(OLD + SETTLE), _0005._run(NEW + _0005.SETTLE),
                             elidable=False),
    ]
