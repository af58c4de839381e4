"""Checkpoints: every chain's head at one moment, in canonical JSON, signed with the
platform's Ed25519 key. The key lives with the model-signing code (workers), which tenants may
not import: the caller passes the signing function in (workers.tasks.audit_checkpoint), and a
verifier passes in the check of a signature against its trusted keys."""

from __future__ import annotations

import base64
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from tenants.models import AuditChainHead, AuditCheckpoint
from tenants.services.audit.record import canonical

# sign(payload bytes) -> (key id, raw signature bytes)
Signer = Callable[[bytes], tuple[str, bytes]]


def audit_checkpoint_write(*, sign: Signer) -> AuditCheckpoint:
    """Sign the current heads. The heads are read under share locks, so no writer moves a
    head while it is read; a checkpoint never waits for more than one append per chain."""
    with transaction.atomic():
        heads = {
            h.chain: [h.seq, h.hash]
            for h in AuditChainHead.objects.select_for_update().order_by("chain")
        }
        now = timezone.now()
        payload = canonical({"at": now.isoformat(timespec="microseconds"), "heads": heads})
        key_id, signature = sign(payload)
        return AuditCheckpoint.objects.create(
            created_at=now,
            payload=payload.decode(),
            key_id=key_id,
            signature=base64.b64encode(signature).decode(),
        )


def checkpoint_parts(checkpoint: AuditCheckpoint) -> tuple[bytes, bytes]:
    """(the exact signed bytes, the raw signature) of a checkpoint, for a verifier."""
    return checkpoint.payload.encode(), base64.b64decode(checkpoint.signature)
