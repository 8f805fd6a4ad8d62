"""No credential is ever stored: a memory block with one is refused, a turn has them replaced.

The block is loaded into every prompt and shown in settings, and conversation chunks come back
from search, so a credential that got into either would keep travelling. A rewrite that
contains one is refused (SECRET_DETECTED, a field violation per line, nothing saved, so the
audit never sees it); a conversation turn, which the caller cannot retype, has each one
replaced by a placeholder that says what kind was removed before it is queued or indexed.

Finding credentials is the detector's job (a port: the adapter wraps a maintained library);
what to do about them is decided here. A detector reports spans and kinds, never a verdict.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from server.domain.errors import ErrorReason, FieldViolation, MemoriaError, SecretDetected


@dataclass(frozen=True)
class SecretFinding:
    """One credential in a text: its kind as a person would name it (e.g. "AWS access key")
    and where it is, as code point offsets `start` (inclusive) to `end` (exclusive)."""

    kind: str
    start: int
    end: int


class SecretDetector(Protocol):
    """Finds credentials in sanitized text (lines separated by `\\n`)."""

    def find(self, text: str) -> Sequence[SecretFinding]:
        """Every credential found in `text`, in any order; spans may overlap."""
        ...


def placeholder(kinds: Sequence[str]) -> str:
    """What replaces a credential in a stored turn, e.g. `[redacted: AWS access key]`."""
    return f"[redacted: {', '.join(kinds)}]"


def refuse_secrets(
    detector: SecretDetector | None,
    text: str,
    *,
    known_lines: Collection[str] = (),
    field: str = "text",
) -> None:
    """Raise SECRET_DETECTED when the sanitized block `text` contains a credential.

    Each line with one gets a field violation `text[line N]` (counted from 1) naming its kinds;
    ErrorInfo metadata `secret_types` lists every kind. Nothing in the error quotes the text.
    Lines in `known_lines` (those of the stored block, checked when they were written) are not
    scanned again: a rewrite usually changes a line or two, and scanning costs about 0.6 us
    per character (a whole 4,000-character block, 2-4 ms).
    """
    if detector is None:
        return
    if known_lines:
        known = set(known_lines)
        text = "\n".join("" if line in known else line for line in text.split("\n"))
    findings = detector.find(text)
    if not findings:
        return
    by_line: dict[int, list[str]] = {}
    for finding in sorted(findings, key=lambda f: (f.start, f.end)):
        kinds = by_line.setdefault(text.count("\n", 0, finding.start) + 1, [])
        if finding.kind not in kinds:
            kinds.append(finding.kind)
    every_kind = list(dict.fromkeys(k for kinds in by_line.values() for k in kinds))
    lines = ", ".join(str(n) for n in by_line)
    raise MemoriaError(
        ErrorReason.SECRET_DETECTED,
        f"the block contains a credential ({', '.join(every_kind)}) on line(s) {lines}; "
        "nothing was saved. Credentials are never stored in memory: remove them and write "
        "the block again.",
        details=SecretDetected(tuple(every_kind)),
        violations=tuple(
            FieldViolation(
                f"{field}[line {n}]",
                f"contains a credential ({', '.join(kinds)}); credentials are never stored",
            )
            for n, kinds in by_line.items()
        ),
    )


def redact_secrets(detector: SecretDetector | None, text: str) -> str:
    """`text` with every credential replaced by its `placeholder`; overlapping findings are
    replaced together, by one placeholder naming each of their kinds."""
    if detector is None or not text:
        return text
    findings = sorted(detector.find(text), key=lambda f: (f.start, f.end))
    if not findings:
        return text
    merged: list[tuple[int, int, list[str]]] = []
    for finding in findings:
        if merged and finding.start < merged[-1][1]:
            start, end, kinds = merged[-1]
            if finding.kind not in kinds:
                kinds.append(finding.kind)
            merged[-1] = (start, max(end, finding.end), kinds)
        else:
            merged.append((finding.start, finding.end, [finding.kind]))
    parts: list[str] = []
    position = 0
    for start, end, kinds in merged:
        parts.append(text[position:start])
        parts.append(placeholder(kinds))
        position = end
    parts.append(text[position:])
    return "".join(parts)


def redact_lines(detector: SecretDetector | None, lines: Sequence[str]) -> tuple[str, ...]:
    """`redact_secrets` over lines (one scan for all of them); a credential spanning lines (a
    private key) leaves one line with its placeholder."""
    if detector is None or not lines:
        return tuple(lines)
    return tuple(redact_secrets(detector, "\n".join(lines)).split("\n"))
