"""The personal memory block: get, render, rewrite, delete, and the memory settings.

Rules (DESIGN 2): one sanitizer and one count for every path; the only edit is a whole
rewrite; empty and over-limit rewrites are refused, never truncated, and so is one that
contains a credential (server/domain/secrets.py); an identical rewrite is a no-op; the model's
writes are last-write-wins while a settings screen can send an etag; a stored block over a
lowered limit is still shown whole; every change appends its audit event in the same
transaction (the store applies a write and its event atomically, only if the memory is still
what the write was decided on); deleted content is never kept.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from server.domain.duplicates import DuplicateGroup, duplicate_groups
from server.domain.errors import (
    BlockTooLong,
    ErrorReason,
    EtagMismatch,
    FieldViolation,
    MemoriaError,
    invalid,
)
from server.domain.ids import turn_reference_violations
from server.domain.model import (
    AuditAction,
    AuditEvent,
    AuditQuery,
    Change,
    Identity,
    NewAuditEvent,
    PrincipalMemory,
    RenderRecord,
    StoredBlock,
    StoredSettings,
    TurnKey,
    TurnRef,
    Writer,
)
from server.domain.ports import Clock, InspectionStore, MemoryStore
from server.domain.provenance import HISTORY_ACTIONS, LineOrigin, line_origins
from server.domain.secrets import SecretDetector, redact_lines, refuse_secrets
from server.domain.text import (
    block_line_count,
    diff_lines,
    lines_of,
    sanitize_and_count,
    truncate_line,
)

R = TypeVar("R")

DEFAULT_CHAR_LIMIT = 4000
MAX_WRITE_ATTEMPTS = 100
"""A write that loses this many races in a row to other writers of the same principal fails
with WRITE_CONFLICT (each lost race means another write succeeded)."""
AUDIT_LINE_CHARS = 200
"""Each changed line kept in the audit log is cut to this many code points."""
ORIGIN_EVENTS_PAGE = 100
"""Audit events read per page while looking for the origins of a block's lines."""
MAX_ORIGIN_EVENTS = 2000
"""At most this many audit events are read for the origins of one block (a page shows them
on load): a line added before them is shown as not recorded rather than the page waiting."""


@dataclass(frozen=True)
class BlockView:
    """A block as the API shows it: sanitized text, its count and the current limit."""

    text: str
    char_count: int
    char_limit: int
    etag: str
    update_time: datetime | None

    @property
    def over_limit(self) -> bool:
        return self.char_count > self.char_limit


@dataclass(frozen=True)
class Rendered:
    """The prompt-ready section, empty when there is no block or memory is off."""

    prompt_section: str
    etag: str
    char_count: int
    char_limit: int


@dataclass(frozen=True)
class RewriteResult:
    """The block after a rewrite and the lines it removed and added."""

    block: BlockView
    removed_lines: tuple[str, ...]
    added_lines: tuple[str, ...]
    changed: bool
    duplicates: tuple[DuplicateGroup, ...] = ()
    """Repeated and near-duplicate lines of the block as it now is (server/domain/duplicates.py),
    pointed out to the writer; nothing was dropped or changed for them."""


@dataclass(frozen=True)
class AnnotatedBlock:
    """A block as the person's page shows it: the block, where each line came from and which
    lines repeat each other."""

    block: BlockView
    origins: tuple[LineOrigin, ...]
    duplicates: tuple[DuplicateGroup, ...]


@dataclass(frozen=True)
class DeleteResult:
    """Whether a block was removed, and how many lines it had."""

    deleted: bool
    removed_line_count: int


@dataclass(frozen=True)
class SettingsView:
    """A principal's memory settings, defaults filled in."""

    memory_enabled: bool
    update_time: datetime | None


def render_header(count: int, limit: int) -> str:
    """The first line of the prompt section, e.g. 'Personal memory (1,234/4,000 characters)'."""
    over = ", over the limit" if count > limit else ""
    return f"Personal memory ({count:,}/{limit:,} characters{over})"


def new_etag() -> str:
    """A fresh opaque etag: 64 random bits, so a block deleted and written again never reuses
    one. An etag names a version and is no secret (only its principal ever sees it), so it
    comes from `random`, which CPython reseeds in a forked child, not from `secrets`: that
    reads the kernel on every call and releases the GIL around it, one more hand-off between
    the server's threads on every write."""
    return f"{random.getrandbits(64):016x}"


class MemoryBlocks:
    """The memory block operations for authenticated callers."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        char_limit: int = DEFAULT_CHAR_LIMIT,
        *,
        secrets: SecretDetector | None = None,
        inspections: InspectionStore | None = None,
    ):
        """`secrets` finds credentials, which a rewrite may not contain (server/domain/secrets.py);
        None checks nothing (unit tests of other rules). `inspections` records the renders
        made for a named turn (server/domain/inspection.py); None records nothing."""
        self._inspections = inspections
        if char_limit <= 0:
            raise ValueError("char_limit must be positive")
        self._store = store
        self._clock = clock
        self._limit = char_limit
        self._secrets = secrets

    @property
    def char_limit(self) -> int:
        return self._limit

    def _view(self, block: StoredBlock | None) -> BlockView:
        if block is None:
            return BlockView("", 0, self._limit, "", None)
        # Sanitize on load too: rows written by other means (SQL, older versions) are cleaned
        # before they can reach a prompt.
        text, count = block.sanitized
        return BlockView(text, count, self._limit, block.etag, block.update_time)

    def get(self, who: Identity) -> BlockView:
        """The caller's block; an empty view when there is none (not an error)."""
        return self._view(self._store.read(who.tenant_id, who.principal_id).block)

    def get_annotated(self, who: Identity) -> AnnotatedBlock:
        """The caller's block with each line's origin (server/domain/provenance.py) and its
        repeated and near-duplicate lines, for the person's screen. Origins read up to
        MAX_ORIGIN_EVENTS of the audit log (measured: GetMemoryBlock fell from 0.83 to 0.19 of
        a no-op with them on every read), so a plain read (`get`) has neither."""
        view = self.get(who)
        if not view.text:
            return AnnotatedBlock(view, (), ())
        origins = line_origins(
            view.text,
            self._history(who),
            line_chars=AUDIT_LINE_CHARS,
            as_of=view.update_time,
        )
        return AnnotatedBlock(view, origins, duplicate_groups(view.text))

    def _history(self, who: Identity) -> Iterator[AuditEvent]:
        """The caller's rewrites, deletions and erasures, newest first, read a page at a time
        (the consumer stops early), at most MAX_ORIGIN_EVENTS."""
        before: int | None = None
        for _ in range(0, MAX_ORIGIN_EVENTS, ORIGIN_EVENTS_PAGE):
            query = AuditQuery(
                principal_id=who.principal_id,
                actions=HISTORY_ACTIONS,
                before_event_id=before,
                limit=ORIGIN_EVENTS_PAGE,
            )
            events = self._store.list_audit(who.tenant_id, query)
            yield from events
            if len(events) < ORIGIN_EVENTS_PAGE:
                return
            before = events[-1].event_id

    def render(self, who: Identity, turn: TurnRef | None = None) -> Rendered:
        """The section for the system prompt; empty with no block or with memory off. With
        `turn`, the version rendered is recorded for that turn (the inspector); without, the
        hot path does nothing more than before."""
        if turn is None:
            return self._render(who)
        violations = turn_reference_violations(turn)
        if violations:
            raise MemoriaError(
                ErrorReason.INVALID_ARGUMENT,
                "invalid request field(s): " + ", ".join(v.field for v in violations),
                violations=tuple(violations),
            )
        rendered = self._render(who)
        if self._inspections is not None:
            key = TurnKey(who.tenant_id, who.principal_id, turn.conversation_id, turn.turn_id)
            record = RenderRecord(rendered.etag, rendered.char_count, self._clock())
            self._inspections.record_render(key, record)
        return rendered

    def _render(self, who: Identity) -> Rendered:
        memory = self._store.read(who.tenant_id, who.principal_id)
        view = self._view(memory.block)
        if not memory.memory_enabled or not view.text:
            return Rendered("", "", 0, self._limit)
        section = render_header(view.char_count, self._limit) + "\n" + view.text
        return Rendered(section, view.etag, view.char_count, self._limit)

    def rewrite(
        self,
        who: Identity,
        text: str,
        writer: Writer,
        etag: str | None = None,
        turn: TurnRef | None = None,
    ) -> RewriteResult:
        """Replace the caller's whole block with `text`; see the module rules. With `turn`,
        the audit event records the turn the write was made in (the inspector shows it)."""
        if turn is not None:
            violations = turn_reference_violations(turn)
            if violations:
                raise invalid(*violations)
        new_text, count = sanitize_and_count(text)
        if count == 0:
            raise MemoriaError(
                ErrorReason.BLOCK_EMPTY,
                "the block is empty after removing invisible characters and whitespace; "
                "nothing was saved. To remove the whole block, call DeleteMemoryBlock.",
                violations=(FieldViolation("text", "must not be empty"),),
            )
        limit = self._limit

        def decide(memory: PrincipalMemory) -> tuple[Change | None, RewriteResult]:
            old = self._view(memory.block)
            identical = memory.block is not None and old.text == new_text
            # Over the limit is refused, except the identical rewrite of a block stored
            # before the limit was lowered: that changes nothing, so it is the no-op any
            # identical rewrite is (DESIGN 2), not an error.
            if count > limit and not identical:
                raise MemoriaError(
                    ErrorReason.BLOCK_TOO_LONG,
                    f"the block has {count:,} characters, over the limit of {limit:,}; "
                    "nothing was saved. Merge or remove lines and write the whole block again.",
                    details=BlockTooLong(count, limit),
                    violations=(
                        FieldViolation(
                            "text", f"has {count} characters; at most {limit} are allowed"
                        ),
                    ),
                )
            _check_etag(etag, memory.block)
            if writer is Writer.MODEL and not memory.memory_enabled:
                raise _memory_disabled()
            if identical:
                return None, RewriteResult(old, (), (), changed=False)
            # Lines the stored block already has were checked when they were written.
            refuse_secrets(self._secrets, new_text, known_lines=lines_of(old.text))
            now = self._clock()
            stored = StoredBlock(text=new_text, etag=new_etag(), update_time=now)
            diff = diff_lines(old.text, new_text)
            event = NewAuditEvent(
                principal_id=who.principal_id,
                action=AuditAction.BLOCK_REWRITTEN,
                writer=writer,
                create_time=now,
                # A block stored before credentials were refused may still hold one: the
                # audit keeps the lines a rewrite removes, so those are redacted first.
                removed_lines=tuple(
                    truncate_line(x, AUDIT_LINE_CHARS)
                    for x in redact_lines(self._secrets, diff.removed)
                ),
                added_lines=tuple(truncate_line(x, AUDIT_LINE_CHARS) for x in diff.added),
                removed_line_count=len(diff.removed),
                added_line_count=len(diff.added),
                char_count=count,
                turn_conversation_id=turn.conversation_id if turn is not None else "",
                turn_id=turn.turn_id if turn is not None else "",
            )
            view = BlockView(new_text, count, self._limit, stored.etag, stored.update_time)
            result = RewriteResult(view, diff.removed, diff.added, changed=True)
            return _change(memory, event, block=stored), result

        result = self._write(who, decide)
        # Once, for the block the write settled on (a lost race decides again; a full block's
        # near-duplicate search is the costliest step of a rewrite's own work).
        return replace(result, duplicates=duplicate_groups(result.block.text))

    def delete(self, who: Identity, writer: Writer, etag: str | None = None) -> DeleteResult:
        """Remove the caller's whole block; the audit keeps only the number of lines."""

        def decide(memory: PrincipalMemory) -> tuple[Change | None, DeleteResult]:
            _check_etag(etag, memory.block)
            if writer is Writer.MODEL and not memory.memory_enabled:
                raise _memory_disabled()
            if memory.block is None:
                return None, DeleteResult(deleted=False, removed_line_count=0)
            removed = block_line_count(memory.block.text)
            event = NewAuditEvent(
                principal_id=who.principal_id,
                action=AuditAction.BLOCK_DELETED,
                writer=writer,
                create_time=self._clock(),
                removed_line_count=removed,
            )
            # The lines of earlier rewrite events are blanked with it: keeping them would
            # make the deletion untrue. The events themselves (who, when, how many) stay.
            change = _change(memory, event, delete_block=True, blank_audit_lines=True)
            return change, DeleteResult(deleted=True, removed_line_count=removed)

        return self._write(who, decide)

    def settings(self, who: Identity) -> SettingsView:
        """The caller's memory settings (memory is on unless turned off)."""
        return _settings_view(self._store.read(who.tenant_id, who.principal_id).settings)

    def update_settings(
        self, who: Identity, writer: Writer, memory_enabled: bool | None
    ) -> SettingsView:
        """Change the given settings; an update that changes nothing is not audited."""

        def decide(memory: PrincipalMemory) -> tuple[Change | None, SettingsView]:
            if memory_enabled is None or memory_enabled == memory.memory_enabled:
                return None, _settings_view(memory.settings)
            if memory_enabled and writer is Writer.MODEL:
                # The person turned memory off; only the person turns it back on. (The model
                # may turn it off, for a person who asks it to stop remembering.)
                raise _memory_disabled()
            now = self._clock()
            stored = StoredSettings(memory_enabled=memory_enabled, update_time=now)
            event = NewAuditEvent(
                principal_id=who.principal_id,
                action=AuditAction.SETTINGS_UPDATED,
                writer=writer,
                create_time=now,
                memory_enabled=memory_enabled,
            )
            return _change(memory, event, settings=stored), _settings_view(stored)

        return self._write(who, decide)

    def _write(
        self, who: Identity, decide: Callable[[PrincipalMemory], tuple[Change | None, R]]
    ) -> R:
        """Read, decide, and answer only a decision whose state still holds: a change is
        applied while it holds (`apply`), a refusal or a no-op is answered once the store
        confirms it (`confirm`); otherwise decide again on what the store now holds. Each
        lost race means another writer succeeded, so the loop ends; its bound only turns a
        pathological pile-up into a clear error.
        """
        tenant, principal = who.tenant_id, who.principal_id
        for _ in range(MAX_WRITE_ATTEMPTS):
            memory = self._store.read(tenant, principal)
            try:
                change, result = decide(memory)
            except MemoriaError:
                if self._store.confirm(tenant, principal, memory):
                    raise
                continue
            if change is None:
                if self._store.confirm(tenant, principal, memory):
                    return result
                continue
            if self._store.apply(tenant, change):
                return result
        raise MemoriaError(
            ErrorReason.WRITE_CONFLICT,
            "the memory changed while this write was being applied, too often in a row; "
            "nothing was saved. Retry the write.",
        )


def _change(memory: PrincipalMemory, event: NewAuditEvent, **what: Any) -> Change:
    """A change decided on `memory`: it applies only while that state still holds."""
    return Change(principal_id=event.principal_id, decided_on=memory, event=event, **what)


def _settings_view(settings: StoredSettings | None) -> SettingsView:
    if settings is None:
        return SettingsView(memory_enabled=True, update_time=None)
    return SettingsView(settings.memory_enabled, settings.update_time)


def _check_etag(etag: str | None, block: StoredBlock | None) -> None:
    """A conditional write must name the current version; "" names "no block"."""
    if etag is None:
        return
    current = block.etag if block is not None else ""
    if etag != current:
        raise MemoriaError(
            ErrorReason.ETAG_MISMATCH,
            "the block changed since it was read; nothing was saved. Load the current block "
            "and apply the change again, or write without an etag to overwrite it.",
            details=EtagMismatch(current),
        )


def _memory_disabled() -> MemoriaError:
    return MemoriaError(
        ErrorReason.MEMORY_DISABLED,
        "the person has turned memory off, so the model may not change it; "
        "the person can still edit it in their settings.",
    )
