"""Checking the log: every chain walked in order, every record's hash recomputed and its link
to the one before checked, the chain's end against its head, and every signed checkpoint
against the records it covers. The first problem of each chain is reported, naming the
record: an edited one (its hash no longer matches), a deleted one (a gap in the sequence, or
an end short of the head), an inserted or reordered one (written after records it precedes,
or not linking to the one before), or a rewritten chain (no longer what a checkpoint signed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from tenants.models import AuditChainHead, AuditCheckpoint, AuditRecord
from tenants.services.audit.record import record_hash, row_fields

BATCH = 2000


@dataclass(frozen=True, slots=True)
class Problem:
    chain: str
    kind: str  # edited, deleted, inserted, reordered, rewritten, checkpoint
    record_id: int | None
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"record id {self.record_id} (seq {self.seq})" if self.record_id else self.chain
        return f"{self.chain}: {self.kind}: {where}: {self.message}"


def _records(chain: str):
    """The chain's records in sequence order, read in batches (keyset, never all at once)."""
    last = -1
    while True:
        batch = list(AuditRecord.objects.filter(chain=chain, seq__gt=last).order_by("seq")[:BATCH])
        yield from batch
        if len(batch) < BATCH:
            return
        last = batch[-1].seq


def _check_record(chain, record, expected_seq, expected_prev, following) -> Problem | None:
    if following is not None and record.id > following.id:
        kind = "inserted" if record.prev_hash == expected_prev else "reordered"
        return Problem(
            chain,
            kind,
            record.id,
            record.seq,
            f"written after record id {following.id}, which follows it in the chain",
        )
    if record.seq != expected_seq:
        if record.seq > expected_seq:
            missing = (
                f"seq {expected_seq}"
                if record.seq == expected_seq + 1
                else f"seq {expected_seq} to {record.seq - 1}"
            )
            return Problem(
                chain, "deleted", record.id, record.seq, f"{missing} missing before this record"
            )
        return Problem(
            chain,
            "inserted",
            record.id,
            record.seq,
            f"seq {record.seq} repeats or goes back (expected {expected_seq})",
        )
    if record_hash(row_fields(record)) != record.hash:
        return Problem(
            chain, "edited", record.id, record.seq, "its contents no longer match its hash"
        )
    if record.prev_hash != expected_prev:
        return Problem(
            chain, "inserted", record.id, record.seq, "it does not link to the record before it"
        )
    return None


def chain_verify(chain: str) -> Problem | None:
    """The first problem of one chain, or None."""
    head = AuditChainHead.objects.filter(chain=chain).first()
    expected_seq = (head.pruned_seq if head else 0) + 1
    expected_prev = head.pruned_hash if head else "0" * 64
    previous, pending = None, None
    for record in _records(chain):
        if pending is not None:
            problem = _check_record(chain, pending, expected_seq, expected_prev, record)
            if problem:
                return problem
            expected_seq, expected_prev, previous = pending.seq + 1, pending.hash, pending
        pending = record
    if pending is not None:
        problem = _check_record(chain, pending, expected_seq, expected_prev, None)
        if problem:
            return problem
        previous = pending
    last_seq = previous.seq if previous else expected_seq - 1
    if head is not None and (head.seq != last_seq or (previous and head.hash != previous.hash)):
        return Problem(
            chain,
            "deleted",
            previous.id if previous else None,
            last_seq,
            f"the chain ends at seq {last_seq} but its head says {head.seq}: the "
            "records after this one are missing",
        )
    return None


def checkpoints_verify(signature_valid: Callable[[AuditCheckpoint], bool]) -> list[Problem]:
    """Each checkpoint's signature, and each chain's record at the checkpoint's seq."""
    problems = []
    heads = {h.chain: h for h in AuditChainHead.objects.all()}
    for checkpoint in AuditCheckpoint.objects.order_by("created_at"):
        if not signature_valid(checkpoint):
            problems.append(
                Problem(
                    "checkpoints",
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {checkpoint.pk} of {checkpoint.created_at} "
                    "has no valid signature by a trusted key",
                )
            )
            continue
        for chain, (seq, digest) in json.loads(checkpoint.payload)["heads"].items():
            head = heads.get(chain)
            if seq == 0 or (head is not None and seq <= head.pruned_seq):
                continue
            record = AuditRecord.objects.filter(chain=chain, seq=seq).first()
            if record is None or record.hash != digest:
                problems.append(
                    Problem(
                        chain,
                        "rewritten",
                        record.id if record else None,
                        seq,
                        f"differs from checkpoint {checkpoint.pk} signed at "
                        f"{checkpoint.created_at}",
                    )
                )
    return problems


def audit_verify(
    *,
    signature_valid: Callable[[AuditCheckpoint], bool] | None = None,
    chains: list[str] | None = None,
) -> list[Problem]:
    """Every chain's first problem, then the checkpoints' (when a signature check is given)."""
    names = chains or sorted(
        set(AuditChainHead.objects.values_list("chain", flat=True))
        | set(AuditRecord.objects.values_list("chain", flat=True).distinct())
    )
    problems = [p for p in (chain_verify(name) for name in names) if p]
    if signature_valid is not None:
        problems += checkpoints_verify(signature_valid)
    return problems
