"""Dashboard settings: defaults, overridden by ``DRAFTSCOPE_*`` environment variables.

docs/security.md says what the access settings (tokens, allowed hosts, proxy addresses) guard."""

from __future__ import annotations

from typing import Annotated

from pydantic import field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from draftscope.units import parse_size

DEFAULT_DATABASE_URL = "sqlite:///./var/draftscope.db"
MIN_TOKEN_CHARS = 16
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # always allowed as Host, with any port


class Settings(BaseSettings):
    """Where the store lives, where the dashboard listens, and how ingest and reads are guarded."""

    model_config = SettingsConfigDict(env_prefix="DRAFTSCOPE_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL  # any SQLAlchemy URL; PostgreSQL via postgresql+psycopg://
    host: str = "127.0.0.1"
    port: int = 8177
    ingest_token: str | None = None  # when set, POST /api/v1/batches needs "Authorization: Bearer <token>"
    read_token: str | None = None  # when set, every page, API answer, export and /metrics needs it
    allow_anonymous_reads: bool = False  # serve on a non-loopback address without a read token
    max_batch_bytes: int = 16 * 1024 * 1024
    refresh_debounce_s: float = 2.0  # a run's aggregates and findings are refreshed at most this often
    public_url: str | None = None  # the address to open, when not host:port (e.g. a published port)
    retain_max_bytes: int | None = None  # keep the store under this size (e.g. 10GB): oldest runs go first
    retain_days: float | None = None  # delete runs last written more than this many days ago
    retain_interval_s: float = 600.0  # how often the dashboard applies the two bounds above
    # Host names (or addresses) the dashboard answers to besides loopback: comma-separated in
    # DRAFTSCOPE_ALLOWED_HOSTS; "*.example.com" matches subdomains, "*" any host (no DNS-rebinding guard)
    allowed_hosts: Annotated[list[str], NoDecode] = []

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)):
            return value
        names = [str(n).strip().lower() for n in names if str(n).strip()]
        for name in names:
            if "/" in name or "@" in name or " " in name:
                raise ValueError(f"DRAFTSCOPE_ALLOWED_HOSTS: {name!r} is not a host name: give names "
                                 "like dash.example.com or 10.0.0.5, comma-separated, without scheme or path")
        return names

    @field_validator("max_batch_bytes")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("DRAFTSCOPE_MAX_BATCH_BYTES must be a positive number of bytes")
        return value

    @field_validator("retain_max_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if value in (None, ""):
            return None
        try:
            return parse_size(value) if isinstance(value, str) else value
        except ValueError as exc:
            raise ValueError(f"DRAFTSCOPE_RETAIN_MAX_BYTES: {exc}") from None

    @field_validator("ingest_token", "read_token")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None

    def token_problems(self, auto_made: bool = False) -> list[str]:
        """Why the tokens cannot guard this dashboard: each one shorter than ``MIN_TOKEN_CHARS``.
        ``auto`` passes unless ``auto_made`` (by then ``serve`` has replaced it with a made-up one)."""
        return [f"DRAFTSCOPE_{name.upper()} is {len(token)} characters: a token needs at least "
                f"{MIN_TOKEN_CHARS} (a short one can be guessed). Set it to 'auto' to have one made "
                "up and printed at start, or make one: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
                for name, token in (("ingest_token", self.ingest_token), ("read_token", self.read_token))
                if token is not None and (auto_made or token != "auto") and len(token) < MIN_TOKEN_CHARS]

    @model_validator(mode="after")
    def _separate_tokens(self) -> "Settings":
        if self.read_token is not None and self.read_token == self.ingest_token != "auto":
            raise ValueError("DRAFTSCOPE_READ_TOKEN must differ from DRAFTSCOPE_INGEST_TOKEN: tracers "
                             "write with the ingest token, people read with the read token")
        return self
