"""One frozen settings object, from environment variables (MEMORIA_*) and command-line flags.

The settings are grouped by what they configure (`settings.qdrant.url`, `settings.jwt.issuer`),
while every setting keeps the one flat name it always had: MEMORIA_QDRANT_URL in the
environment, `qdrant_url` as a keyword (`Settings(qdrant_url=...)`, the flags' path), listed in
`SETTINGS`. Flags given on the command line win over the environment; the environment wins over
the defaults. Validated at start (a refusal names the variable to change: `InvalidSettings`),
printed redacted, and documented by `python -m server.runtime.settings --markdown`
(docs/configuration.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from server.runtime.settings.groups import (
    QDRANT_GRPC_PORT,
    QDRANT_REST_PORT,
    AccessSettings,
    AuthMode,
    Conflict,
    EmbeddingSettings,
    HttpSettings,
    IndexingSettings,
    JwtSettings,
    LimitsSettings,
    MemorySettings,
    QdrantSettings,
    ServeSettings,
    SettingsGroup,
    StoreSettings,
    is_loopback,
    listen_host,
)

__all__ = [
    "BY_FLAT_NAME",
    "QDRANT_GRPC_PORT",
    "QDRANT_REST_PORT",
    "SETTINGS",
    "AccessSettings",
    "AuthMode",
    "EmbeddingSettings",
    "HttpSettings",
    "IndexingSettings",
    "InvalidSettings",
    "JwtSettings",
    "LimitsSettings",
    "MemorySettings",
    "QdrantSettings",
    "ServeSettings",
    "Setting",
    "Settings",
    "StartupRefusal",
    "StoreSettings",
    "is_loopback",
    "listen_host",
    "naming",
]

ENV_PREFIX = "MEMORIA_"
_TOOLING_ENV_PREFIXES = ("MEMORIA_TEST_", "MEMORIA_PG_", "MEMORIA_REQUIRE_", "MEMORIA_BENCH_")
"""Variables of the test and benchmark tooling, not of the server."""

_CLIENT_ENV = frozenset(
    {"MEMORIA_SERVER", "MEMORIA_TOKEN", "MEMORIA_TENANT", "MEMORIA_PRINCIPAL", "MEMORIA_ADDR"}
    | {f"MEMORIA_MCP_{name}" for name in ("TARGET", "TOKEN", "TENANT", "PRINCIPAL")}
)
"""Variables of the client commands (memoria export, import, mcp: memoria_client/connection.py),
which a shell that runs both may well export: known, so not reported as typos."""


class _FlatEnvironment(EnvSettingsSource):
    """Reads each setting from its flat variable (MEMORIA_QDRANT_URL, or an older alias),
    decoded as pydantic-settings decodes any field (JSON for lists), keyed by its flat name."""

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            for env in setting.env_names:
                raw = self.env_vars.get(env if self.case_sensitive else env.lower())
                if raw is not None:
                    values[setting.flat] = self.prepare_field_value(
                        setting.flat, setting.info, raw, False
                    )
                    break
        return values


class Settings(BaseSettings):
    """Everything that configures a Memoria process, by group."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    serve: ServeSettings = ServeSettings()
    http: HttpSettings = HttpSettings()
    access: AccessSettings = AccessSettings()
    jwt: JwtSettings = JwtSettings()
    store: StoreSettings = StoreSettings()
    qdrant: QdrantSettings = QdrantSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    indexing: IndexingSettings = IndexingSettings()
    memory: MemorySettings = MemorySettings()
    limits: LimitsSettings = LimitsSettings()

    def __init__(self, **values: Any) -> None:
        """Flat names (`qdrant_url=...`) or groups (`qdrant={...}`), over the environment.
        Raises InvalidSettings, which names the variable of each invalid setting."""
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise InvalidSettings.of(error) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords first, then the flat MEMORIA_* variables (no .env file, no secrets dir)."""
        return init_settings, _FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _group_flat_names(cls, data: Any) -> Any:
        """Moves each flat name (`qdrant_url`) into its group (`qdrant.url`); an unknown
        name stays where it is, for extra="forbid" to refuse."""
        if not isinstance(data, dict):
            return data
        grouped: dict[str, Any] = {}
        for key, value in data.items():
            setting = BY_FLAT_NAME.get(key)
            if setting is None:
                grouped[key] = value if key not in grouped else {**_fields(value), **grouped[key]}
            else:
                group = _fields(grouped.get(setting.group))
                grouped[setting.group] = {**group, setting.name: value}
        return grouped

    @model_validator(mode="after")
    def _check(self) -> Settings:
        """Settings of several groups that must agree: jwt (chosen, or `auto` off loopback)
        needs a key source."""
        if self.effective_auth == "jwt" and not self.jwt.configured:
            # With `auto`, an address off loopback is what made it jwt: name it too.
            listens = (("listen", self.serve.listen), ("http_listen", self.http.listen))
            names = [
                name
                for name, listen in listens
                if self.access.mode == "auto" and listen and not is_loopback(listen_host(listen))
            ]
            raise Conflict(
                "jwt authentication needs MEMORIA_JWT_HS256_SECRET, MEMORIA_JWT_PUBLIC_KEY_FILE "
                "or MEMORIA_JWT_JWKS_FILE (trusted-headers is the default only on loopback)",
                *names,
                "auth",
            )
        return self

    @property
    def effective_auth(self) -> Literal["jwt", "trusted-headers"]:
        """auto means trusted-headers only when nothing outside this machine can connect,
        to the gRPC port or to the HTTP one (which carries the same headers)."""
        if self.access.mode != "auto":
            return self.access.mode
        listens = [self.serve.listen, *([self.http.listen] if self.http.listen else [])]
        local = all(is_loopback(listen_host(listen)) for listen in listens)
        return "trusted-headers" if local else "jwt"

    def replace(self, **flat: Any) -> Settings:
        """These settings with some changed, by flat name (`index_worker_threads=1`), checked
        as a start checks them (the environment is not read again)."""
        changed = {name: _fields(getattr(self, name)) for name in type(self).model_fields}
        for key, value in flat.items():
            setting = BY_FLAT_NAME[key]
            changed[setting.group][setting.name] = value
        try:
            return type(self).model_validate(changed)
        except ValidationError as error:
            raise InvalidSettings.of(error) from None

    @classmethod
    def unknown_env(cls, environ: Mapping[str, str]) -> list[str]:
        """MEMORIA_* variables that configure nothing (a typo would otherwise pass silently)."""
        known = {env for setting in SETTINGS for env in setting.env_names}
        return sorted(
            key
            for key in environ
            if key.startswith(ENV_PREFIX)
            and key not in known
            and key not in _CLIENT_ENV
            and not key.startswith(_TOOLING_ENV_PREFIXES)
        )

    def redacted(self) -> dict[str, dict[str, Any]]:
        """The settings by group, as JSON values with secrets masked, plus what the settings
        derive (`derived`), for the start-up log."""
        values: dict[str, dict[str, Any]] = {
            name: getattr(self, name).model_dump(mode="json") for name in type(self).model_fields
        }
        derived: dict[str, Any] = {"auth": self.effective_auth}
        if self.qdrant.url is not None:
            derived["qdrant_grpc_port"] = (
                self.qdrant.effective_grpc_port if self.qdrant.prefer_grpc else None
            )
        values["derived"] = derived
        return values


def _fields(group: Any) -> dict[str, Any]:
    """A group's values as a dict, whether given as a model, a dict or not at all."""
    if group is None:
        return {}
    return dict(group) if isinstance(group, BaseModel) else {**group}


@dataclass(frozen=True)
class Setting:
    """One setting: its flat name, variables, group and field (type, default, description)."""

    flat: str
    group: str
    name: str
    info: FieldInfo
    env_names: tuple[str, ...]

    @property
    def env(self) -> str:
        """Its variable, e.g. MEMORIA_QDRANT_URL."""
        return self.env_names[0]

    @property
    def secret(self) -> bool:
        """Whether its value is never printed."""
        annotation = self.info.annotation
        return annotation is SecretStr or SecretStr in get_args(annotation)


def _settings() -> tuple[Setting, ...]:
    found = []
    for group, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, SettingsGroup)
        for name, info in model.model_fields.items():
            flat = model.flat_names.get(name, model.flat_prefix + name)
            env_names = (f"{ENV_PREFIX}{flat.upper()}", *model.env_aliases.get(name, ()))
            found.append(Setting(flat, group, name, info, env_names))
    return tuple(found)


SETTINGS = _settings()
"""Every setting, group by group, in the order the groups declare them."""
BY_FLAT_NAME = {setting.flat: setting for setting in SETTINGS}
BY_FIELD = {(setting.group, setting.name): setting for setting in SETTINGS}
# A flat name that is also a group's would be ambiguous as a keyword.
assert not set(BY_FLAT_NAME) & set(Settings.model_fields)


def naming(flat: str, flags: Mapping[str, str]) -> str:
    """How a refusal names a setting: its variable, and its flag when the command has one."""
    env = BY_FLAT_NAME[flat].env
    return f"{env} (or {flags[flat]})" if flat in flags else env


class InvalidSettings(ValueError):
    """Settings refused at start: one problem per invalid setting, each naming its variable
    (and, through `lines(flags)`, the command's flag)."""

    def __init__(self, problems: list[tuple[tuple[str, ...], str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    @classmethod
    def of(cls, error: ValidationError) -> InvalidSettings:
        """pydantic's errors, each located by the flat names of the settings it is about."""
        problems = []
        for detail in error.errors():
            loc = detail["loc"]
            cause = detail.get("ctx", {}).get("error")
            message = str(cause) if isinstance(cause, ValueError) else detail["msg"]
            setting = BY_FIELD.get((str(loc[0]), str(loc[1]))) if len(loc) >= 2 else None
            if isinstance(cause, Conflict):
                names = cause.names
            elif setting is not None:
                names = (setting.flat,)
                if not setting.secret and detail["type"] != "missing":
                    message = f"{message} (got {json.dumps(detail['input'], default=str)})"
            else:  # an unknown keyword (code passing a name no setting has)
                names, message = (), f"{'.'.join(map(str, loc))}: {message}"
            problems.append((names, message))
        return cls(problems)

    def lines(self, flags: Mapping[str, str] | None = None) -> list[str]:
        """One line per problem: 'MEMORIA_X (or --x): what is wrong'."""
        return [
            f"{', '.join(naming(n, flags or {}) for n in names)}: {message}" if names else message
            for names, message in self.problems
        ]


class StartupRefusal(SystemExit):
    """A start that cannot go on (a port taken, a store unreachable, a model mismatch): one
    line saying why and which settings to look at, for the command to print and exit 1.
    Uncaught, it still exits 1 with that line (it is a SystemExit)."""

    def __init__(self, message: str, *names: str) -> None:
        self.message = message
        self.names = names
        super().__init__(self.line())

    def line(self, flags: Mapping[str, str] | None = None) -> str:
        """'why; check MEMORIA_X (or --x)'."""
        if not self.names:
            return self.message
        return f"{self.message}; check {', '.join(naming(n, flags or {}) for n in self.names)}"
