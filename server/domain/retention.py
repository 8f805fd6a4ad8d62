"""Turn retention: how long a tenant's conversation turns are kept (issue 24, item 4).

The operator sets a deployment default and per-tenant values (MEMORIA_TURN_RETENTION_DAYS,
MEMORIA_TENANT_TURN_RETENTION_DAYS; docs/decisions.md says why not an RPC). Off (the default)
keeps turns until they are deleted.

Rules, decided here and nowhere else:
- A turn is expired once its `turn_time` is more than the tenant's retention before the clock
  (`TurnRetention.cutoff`: turns before the cutoff are expired, turns at it are kept).
- An expired turn is out of reach at once, like a deleted conversation, whether or not the
  purge has run: the search takes the cutoff as a lower time bound in the engine (the later of
  it and the caller's own start_time, `bounded`), and ListConversations,
  ListConversationTurns, the export and the inspector read only turns at or after it.
- The purge (`RetentionPurge.purge_once`, run by the index worker) removes expired turns' rows
  and their chunks, a bounded number per pass, and audits each principal's purge with the
  number of turns removed only (no text, no turn or conversation ids): the same as an erasure
  records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from server.domain.model import (
    AuditAction,
    ExpiryCutoffs,
    NewAuditEvent,
    SearchBounds,
    Writer,
)
from server.domain.ports import ChunkWriter, Clock, TurnStore, UnitsOfWork


@dataclass(frozen=True)
class TurnRetention:
    """The retention policy of a deployment: `default` for every tenant not in `tenants`,
    which maps a tenant to its own value. A period of None keeps turns until deleted."""

    default: timedelta | None = None
    tenants: Mapping[str, timedelta | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        periods = [self.default, *self.tenants.values()]
        if any(p is not None and p <= timedelta(0) for p in periods):
            raise ValueError("a retention period must be positive (None keeps turns)")

    @property
    def active(self) -> bool:
        """True when some tenant's turns can expire (else no purge needs to run)."""
        return self.default is not None or any(p is not None for p in self.tenants.values())

    def period(self, tenant_id: str) -> timedelta | None:
        """The tenant's retention: its own value when set, else the deployment default."""
        return self.tenants.get(tenant_id, self.default)

    def days(self, tenant_id: str) -> int:
        """The tenant's retention in whole days, 0 when turns are kept until deleted (what
        the export states)."""
        period = self.period(tenant_id)
        return 0 if period is None else period.days

    def cutoff(self, tenant_id: str, now: datetime) -> datetime | None:
        """The earliest turn time the tenant still keeps at `now`; None keeps every turn."""
        period = self.period(tenant_id)
        return None if period is None else now - period

    def cutoffs(self, now: datetime) -> ExpiryCutoffs:
        """Every tenant's cutoff at `now`, as the purge asks the store for expired turns."""
        return ExpiryCutoffs(
            default=None if self.default is None else now - self.default,
            tenants=tuple(
                (tenant, None if p is None else now - p)
                for tenant, p in sorted(self.tenants.items())
            ),
        )

    def bounded(self, tenant_id: str, now: datetime, bounds: SearchBounds) -> SearchBounds:
        """The caller's search bounds with the retention's cutoff as a lower time bound (the
        later of the two starts): an expired turn is never scored."""
        cutoff = self.cutoff(tenant_id, now)
        if cutoff is None or (bounds.start_time is not None and bounds.start_time >= cutoff):
            return bounds
        return replace(bounds, start_time=cutoff)


KEEP_EVERYTHING = TurnRetention()
"""Retention off: turns are kept until deleted (the default)."""


def _never() -> datetime:
    """The clock of a policy that keeps everything: its cutoff never reads it."""
    return datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class TurnsKept:
    """The policy against the clock, for the reads that show turns (ListConversations,
    ListConversationTurns, the export, the inspector): which turns a tenant still keeps."""

    retention: TurnRetention = KEEP_EVERYTHING
    clock: Clock = _never

    def since(self, tenant_id: str) -> datetime | None:
        """The earliest turn time the tenant keeps now; None keeps every turn."""
        return self.retention.cutoff(tenant_id, self.clock()) if self.retention.active else None

    def keeps(self, tenant_id: str, turn_time: datetime) -> bool:
        """Whether a turn of this time is still kept."""
        since = self.since(tenant_id)
        return since is None or turn_time >= since


KEEP_ALL_TURNS = TurnsKept()


@dataclass(frozen=True)
class RetentionPurge:
    """Removes expired turns in the background (for IndexWorker's purges)."""

    retention: TurnRetention
    turns: TurnStore
    units: UnitsOfWork
    chunks: ChunkWriter
    clock: Clock

    def purge_once(self, limit: int) -> int:
        """Purge up to `limit` principals' expired turns, up to `limit` turns each: for each,
        while none of its turns can be indexed, its expired chunks leave the index, then its
        expired rows go with an audit event of their count in one transaction (so a failed
        commit leaves rows whose chunks the next pass removes again, never the reverse).
        Return how many turns were removed."""
        if not self.retention.active:
            return 0
        now = self.clock()
        removed = 0
        for tenant_id, principal_id in self.turns.expired_principals(
            self.retention.cutoffs(now), limit
        ):
            cutoff = self.retention.cutoff(tenant_id, now)
            if cutoff is None:
                continue
            with self.units(tenant_id, principal_id, exclusive=True) as uow:
                self.chunks.delete_before(tenant_id, principal_id, cutoff)
                count = uow.turns.delete_before(cutoff, limit)
                if count:
                    uow.audit.append(
                        NewAuditEvent(
                            principal_id=principal_id,
                            action=AuditAction.TURNS_EXPIRED,
                            writer=Writer.SERVICE,
                            create_time=now,
                            deleted_turn_count=count,
                        )
                    )
                uow.commit()
            removed += count
        return removed
