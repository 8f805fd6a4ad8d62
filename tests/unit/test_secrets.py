"""No credential is stored: the detector adapter's findings (true and false positives), the
domain's refusal of a block and redaction of a turn, and the wiring into rewrite and IndexTurn."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.adapters.secret_detector import DetectSecretsDetector
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, Writer
from server.domain.secrets import SecretFinding, redact_secrets, refuse_secrets
from tests.fakes import InMemoryMemoryStore

DETECTOR = DetectSecretsDetector()
# Made-up credentials in each provider's format (none is real; the AWS one is AWS's own
# documentation example).
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
CREDENTIALS = [
    # (text, the secret part, the kind named)
    ("AWS key AKIAIOSFODNN7EXAMPLE for the backups", "AKIAIOSFODNN7EXAMPLE", "AWS access key"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789 is my token", None, "GitHub token"),
    ("glpat-abcdefghij0123456789 for CI", "glpat-abcdefghij0123456789", "GitLab token"),
    (
        "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
        "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
        "Slack token",
    ),
    ("pay sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "Stripe API key"),
    (
        "OpenAI sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst",
        "sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst",
        "OpenAI API key",
    ),
    (f"session {JWT} expires", JWT, "JSON Web Token"),
    ("password: hunter2", "hunter2", "password"),
    ("Wi-Fi password: sunshine", "sunshine", "password"),
    ("password: hunter2 (the old one)", "hunter2", "password"),
    ("db_password=Sup3r$ecret", "Sup3r$ecret", "password"),
    ("postgres://admin:s3cretpw@db.example.com:5432/app", "s3cretpw", "password in a URL"),
    (
        "my key\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "private key",
    ),
]  # fmt: skip
ORDINARY = [
    "Preferred name: Ana",
    "Uses Jira account ana-42; ticket PROJ-1234 is blocked",
    "Refund went to acct-4821 on 2026-11-02",
    "Email: ana@example.com, phone +351 912 345 678",
    "See https://example.com/path?q=1 and https://user@example.com/x",
    "Secret: she is planning a surprise party for Rui",
    "Uses a password manager: 1Password",
    "Forgot her password last week; password reset on Monday",
    "Her secret: none",
    "Commit 3f2a9c1d0e7b fixed it; request id 123e4567-e89b-12d3-a456-426614174000",
    "The key: be concise. API keys live in the vault, never in chat.",
    "Likes short answers, writes in Portuguese and English",
    "Server at 10.0.0.12, port 5432, database memoria",
    "Token budget: 4000 characters",
]
WHO = Identity(tenant_id="acme", principal_id="ana")
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "secret", "kind"), CREDENTIALS, ids=[c[2] for c in CREDENTIALS])
def test_each_kind_of_credential_is_found_and_redacted_whole(
    text: str, secret: str | None, kind: str
) -> None:
    findings = DETECTOR.find(text)
    assert kind in {f.kind for f in findings}
    redacted = redact_secrets(DETECTOR, text)
    assert f"[redacted: {kind}" in redacted
    if secret is not None:
        assert secret not in redacted
    # Nothing of the token survives, not even its tail.
    assert "abcdefghij" not in redacted and "MIIE" not in redacted and "EXAMPLE" not in redacted


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_not_a_credential(text: str) -> None:
    assert list(DETECTOR.find(text)) == []
    assert redact_secrets(DETECTOR, text) == text


def test_a_redacted_text_has_nothing_left_to_redact() -> None:
    text = "\n".join(t for t, _, _ in CREDENTIALS)
    once = redact_secrets(DETECTOR, text)
    assert redact_secrets(DETECTOR, once) == once
    assert list(DETECTOR.find(once)) == []


def test_redaction_keeps_the_text_around_a_credential() -> None:
    assert redact_secrets(DETECTOR, "password: hunter2 (old)") == (
        "password: [redacted: password] (old)"
    )
    assert redact_secrets(DETECTOR, "postgres://admin:s3cretpw@db/app") == (
        "postgres://admin:[redacted: password in a URL]@db/app"
    )


class Spans:
    """A detector reporting given findings, for the domain's own rules."""

    def __init__(self, *findings: SecretFinding) -> None:
        self.findings = findings
        self.scanned: list[str] = []

    def find(self, text: str) -> Sequence[SecretFinding]:
        self.scanned.append(text)
        return self.findings


def test_overlapping_findings_become_one_placeholder_naming_both() -> None:
    detector = Spans(SecretFinding("password", 9, 20), SecretFinding("Stripe API key", 9, 41))
    text = "api_key: sk_live_4eC39HqLyjWDarjtT1zdp7dc!"
    assert redact_secrets(detector, text) == "api_key: [redacted: password, Stripe API key]!"


def test_a_refusal_names_each_line_and_kind_never_the_secret() -> None:
    text = "Name: Ana\npassword: hunter2\nok\nAWS AKIAIOSFODNN7EXAMPLE and token " + JWT
    with pytest.raises(MemoriaError) as caught:
        refuse_secrets(DETECTOR, text)
    error = caught.value
    assert error.reason is ErrorReason.SECRET_DETECTED
    fields = {v.field: v.description for v in error.violations}
    assert set(fields) == {"text[line 2]", "text[line 4]"}
    assert "password" in fields["text[line 2]"]
    assert "AWS access key" in fields["text[line 4]"]
    assert "JSON Web Token" in fields["text[line 4]"]
    assert error.metadata["secret_types"] == "password,AWS access key,JSON Web Token"
    everything = error.message + repr(error.metadata) + repr(error.violations)
    for secret in ("hunter2", "AKIAIOSFODNN7EXAMPLE", JWT[:20]):
        assert secret not in everything


def test_known_lines_are_not_scanned_again_and_keep_their_numbers() -> None:
    detector = Spans()
    refuse_secrets(detector, "a\nb\nc", known_lines=["a", "c"])
    assert detector.scanned == ["\nb\n"]


def _blocks(detector: DetectSecretsDetector | None = DETECTOR) -> MemoryBlocks:
    return MemoryBlocks(InMemoryMemoryStore(), lambda: NOW, secrets=detector)


def test_a_rewrite_with_a_credential_saves_nothing_and_audits_nothing() -> None:
    blocks = _blocks()
    blocks.rewrite(WHO, "Name: Ana", Writer.USER)
    with pytest.raises(MemoriaError) as caught:
        blocks.rewrite(WHO, "Name: Ana\nWi-Fi password: sunshine", Writer.MODEL)
    assert caught.value.reason is ErrorReason.SECRET_DETECTED
    assert [v.field for v in caught.value.violations] == ["text[line 2]"]
    assert blocks.get(WHO).text == "Name: Ana"


def test_an_invisible_character_does_not_hide_a_credential() -> None:
    """The block is sanitized before it is scanned."""
    blocks = _blocks()
    with pytest.raises(MemoriaError):
        blocks.rewrite(WHO, "AKIA\u200bIOSFODNN7\u2060EXAMPLE", Writer.MODEL)


def test_without_a_detector_nothing_is_refused() -> None:
    blocks = _blocks(None)
    assert blocks.rewrite(WHO, "password: hunter2", Writer.USER).changed


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(ORDINARY + [t for t, _, _ in CREDENTIALS]), max_size=8),
)
def test_redaction_removes_every_credential_from_any_mix(lines: list[str]) -> None:
    text = "\n".join(lines)
    redacted = redact_secrets(DETECTOR, text)
    assert list(DETECTOR.find(redacted)) == []
    for _, secret, _ in CREDENTIALS:
        if secret is not None:
            assert secret not in redacted
    for line in ORDINARY:
        if line in lines:
            assert line in redacted


def test_the_audit_of_removing_a_credential_stored_before_the_rule_redacts_it() -> None:
    store = InMemoryMemoryStore()
    MemoryBlocks(store, lambda: NOW).rewrite(WHO, "Name: Ana\npassword: hunter2", Writer.USER)
    blocks = MemoryBlocks(store, lambda: NOW, secrets=DETECTOR)
    result = blocks.rewrite(WHO, "Name: Ana", Writer.USER)
    assert result.removed_lines == ("password: hunter2",)  # the caller's own diff
    events = [event for _, event in store.audit]
    assert events[-1].removed_lines == ("password: [redacted: password]",)
    assert "hunter2" not in repr(events[-1])


def test_the_regex_engine_matches_what_the_plugins_own_patterns_match() -> None:
    """The adapter runs detect-secrets' patterns on `regex` for speed; the matches must be the
    ones the library's `re` patterns give."""
    texts = [t for t, _, _ in CREDENTIALS] + ORDINARY
    compared = 0
    for _, plugin, _, patterns in DETECTOR._plugins:
        for original, compiled in zip(plugin.denylist, patterns, strict=True):
            for text in texts:
                assert [m.span() for m in original.finditer(text)] == [
                    m.span() for m in compiled.finditer(text)
                ], (original.pattern, text)
                compared += 1
    assert compared > 20 * len(texts)
