"""The credential detector behind the domain's SecretDetector port: Yelp's detect-secrets.

detect-secrets (Apache-2.0, pure Python, about 1 MB) is the maintained detector most
pre-commit set-ups use: one plugin per provider (AWS, GitHub, GitLab, Slack, Stripe, OpenAI,
Twilio, SendGrid, npm, PyPI, Azure, IBM, JSON Web Tokens, private keys, passwords in URLs...)
and a keyword detector for `password: ...` style assignments. Its scanning entry points work
on files and global settings (not thread-safe, and they clear caches on every call), so this
adapter runs the plugins' own patterns directly (compiled by the `regex` engine): each
plugin's `denylist` over the whole text once, the keyword patterns only on lines that name a
keyword at all. Nothing is verified over
the network (that is a setting this adapter never turns on).

Left out, with their reasons:
- the high-entropy string plugins: they flag any random-looking quoted string (hashes, ids,
  ciphertext in a pasted log), which in prose are mostly not credentials;
- the public IPv4 plugin: an address is no credential.

The keyword detector is taken in its configuration-file form (`password: hunter2`,
`db_password=...`, unquoted), which is how people write a password in prose. A password is
the first word after its keyword ("password: hunter2 (the old one)"); after the other
keywords (`secret`, `api_key`...) only a value of one word counts: "Secret: she is planning a
party" is a sentence, not a credential.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import regex
from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.filters.heuristic import (
    is_not_alphanumeric_string,
    is_prefixed_with_dollar_sign,
    is_templated_secret,
)
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.keyword import CONFIG_DENYLIST_REGEX_TO_GROUP, DENYLIST

from server.domain.secrets import SecretFinding

LEFT_OUT = frozenset(
    {"Base64 High Entropy String", "Hex High Entropy String", "Public IP (ipv4)", "Secret Keyword"}
)
"""Plugins not run as regex plugins (see the module docstring; keywords are run apart)."""

KINDS = {
    "AWS Access Key": "AWS access key",
    "Artifactory Credentials": "Artifactory token",
    "Azure Storage Account access key": "Azure storage account key",
    "Basic Auth Credentials": "password in a URL",
    "Cloudant Credentials": "Cloudant credentials",
    "Discord Bot Token": "Discord bot token",
    "GitHub Token": "GitHub token",
    "GitLab Token": "GitLab token",
    "IBM COS HMAC Credentials": "IBM COS HMAC credentials",
    "IBM Cloud IAM Key": "IBM Cloud IAM key",
    "JSON Web Token": "JSON Web Token",
    "Mailchimp Access Key": "Mailchimp API key",
    "NPM tokens": "npm token",
    "OpenAI Token": "OpenAI API key",
    "Private Key": "private key",
    "PyPI Token": "PyPI token",
    "SendGrid API Key": "SendGrid API key",
    "Slack Token": "Slack token",
    "SoftLayer Credentials": "SoftLayer credentials",
    "Square OAuth Secret": "Square OAuth secret",
    "Stripe Access Key": "Stripe API key",
    "Telegram Bot Token": "Telegram bot token",
    "Twilio API Key": "Twilio API key",
}
"""detect-secrets' type names as a person reads them; a plugin added later keeps its own."""

_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_\-+/=.]*")
"""Characters a token continues with: a pattern that stops early (the JWT one ends before the
signature) still has the whole token replaced."""

_KEYWORD = re.compile("|".join(DENYLIST))
"""Any of the keyword detector's keywords (all lowercase), searched in lowercased text:
several times faster than the same pattern with IGNORECASE, which this pre-check exists for."""
_PASSWORD_KEYWORD = re.compile(r"pass|pwd|contras", re.IGNORECASE)
_NO_VALUE = frozenset({"none", "null", "nil", "n/a", "na", "unknown", "empty", "unset", "tbd"})
"""Words that say a keyword has no value: "secret: none" names no secret."""

_PEM_END = re.compile(r"-----END [A-Z0-9 ]*-----|^Private-MAC: \S+$", re.MULTILINE)
"""Where an armored private key (PEM, OpenSSH, PGP, PuTTY) ends: detect-secrets finds its
first line, and everything from there to this line is the key."""


class DetectSecretsDetector:
    """SecretDetector over detect-secrets' plugins; safe to share between threads (the plugins
    are compiled patterns, and nothing here keeps state between calls)."""

    def __init__(self) -> None:
        self._plugins: list[tuple[str, RegexBasedDetector, bool, list[regex.Pattern[str]]]] = []
        plugin_classes: dict[str, type[Any]] = get_mapping_from_secret_type_to_class()
        for secret_type, plugin_class in sorted(plugin_classes.items()):
            if secret_type in LEFT_OUT or not issubclass(plugin_class, RegexBasedDetector):
                continue
            plugin: RegexBasedDetector = plugin_class()
            # A plugin that overrides analyze_string checks its matches further (the JWT one
            # decodes them); its verdict on each match is asked for.
            validates = type(plugin).analyze_string is not RegexBasedDetector.analyze_string
            # The same patterns, compiled by the `regex` engine: same syntax and matches, and
            # 2 to 70 times faster on these (measured; it skips ahead to their literal parts).
            patterns = [regex.compile(p.pattern, p.flags) for p in plugin.denylist]
            kind = KINDS.get(secret_type, secret_type)
            self._plugins.append((kind, plugin, validates, patterns))

    def find(self, text: str) -> Sequence[SecretFinding]:
        """Every credential in `text` (see the module docstring for what counts)."""
        return [*self._regex_findings(text), *self._keyword_findings(text)]

    def _regex_findings(self, text: str) -> Iterator[SecretFinding]:
        for kind, plugin, validates, patterns in self._plugins:
            for pattern in patterns:
                for match in pattern.finditer(text):
                    if validates and _value(match) not in set(plugin.analyze_string(match[0])):
                        continue
                    start, end = _secret_span(match)
                    if kind == "private key":
                        start, end = _private_key_span(text, start, end)
                    else:
                        end = _TOKEN_TAIL.match(text, end).end()  # type: ignore[union-attr]
                    start, end = _trim(text, start, end)
                    if start < end:
                        yield SecretFinding(kind, start, end)

    def _keyword_findings(self, text: str) -> Iterator[SecretFinding]:
        """The keyword patterns, only on the lines that name one of the keywords at all."""
        if not _KEYWORD.search(text.lower()):
            return
        line_start = 0
        for line in text.split("\n"):
            if _KEYWORD.search(line.lower()):
                yield from _keyword_line(line, line_start)
            line_start += len(line) + 1


def _keyword_line(line: str, offset: int) -> Iterator[SecretFinding]:
    for pattern, group in CONFIG_DENYLIST_REGEX_TO_GROUP.items():
        for match in pattern.finditer(line):
            value, start = match[group], match.start(group)
            password = _PASSWORD_KEYWORD.search(match[1]) is not None
            if password and value:
                # A password is one word: "password: hunter2 (the old one)" names hunter2.
                value = value.split()[0].rstrip(".,;:)]!?")
            if (
                not value
                or any(ch.isspace() for ch in value)
                or value.lower() in _NO_VALUE
                or is_templated_secret(value)
                or is_prefixed_with_dollar_sign(value)
                or is_not_alphanumeric_string(value)
            ):
                continue
            kind = "password" if password else "secret"
            yield SecretFinding(kind, offset + start, offset + start + len(value))


def _value(match: regex.Match[str]) -> Any:
    """What `findall` (and so the plugin's analyze_string) yields for this match."""
    groups = match.groups()
    if not groups:
        return match[0]
    return groups[0] if len(groups) == 1 else groups


def _secret_span(match: regex.Match[str]) -> tuple[int, int]:
    """The credential inside a match: a pattern's first group when it follows some context
    (`://user:` before a password), else the whole match (`ghp` is a prefix, not the token)."""
    if match.re.groups and match.start(1) > match.start():
        return match.span(1)
    return match.span()


def _private_key_span(text: str, start: int, end: int) -> tuple[int, int]:
    """From the key's armor (`-----BEGIN`) through its END line, or to the end of the text
    when the key was cut off."""
    while start > 0 and text[start - 1] == "-":
        start -= 1
    last = _PEM_END.search(text, end)
    return start, last.end() if last else len(text)


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Whitespace around a match (some patterns start with `\\s`) stays in the text."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
