"""The tracer's configuration: defaults, environment overrides, validation with a clear message."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any, Dict, Mapping, Optional

from draftscope_tracer.redact import public_url, redact_tracer_config

# Every environment variable the tracer reads, with its meaning (docs/tracer.md lists the same set;
# tests/tracer/test_runtime.py::test_every_option_is_documented checks that it does).
OPTIONS: Dict[str, str] = {
    "DRAFTSCOPE_URL": "dashboard base URL; traces are POSTed to {URL}/api/v1/batches",
    "DRAFTSCOPE_DB": "SQLite file migrated by `draftscope db upgrade`; traces are written into it",
    "DRAFTSCOPE_FILE": "JSON-lines file; each batch is appended as one line (`draftscope import FILE`)",
    "DRAFTSCOPE_MODELS_ROOT": "folder the model paths are recorded relative to (e.g. target, drafts/v2): no machine "
                              "path in the run record; unset: paths as the server holds them",
    "DRAFTSCOPE_DISABLE": "1 turns the tracer off even when a sink is set",
    "DRAFTSCOPE_SAMPLE_RATE": "fraction of requests sampled in detail, e.g. 1/16 (default) or 0.25 or 1",
    "DRAFTSCOPE_STEP_STRIDE": "record every n-th verify step of a sampled request (default 1)",
    "DRAFTSCOPE_TOPK": "how many top-k entries are kept per position, draft and target (default 8)",
    "DRAFTSCOPE_INGEST_TOKEN": "bearer token sent with every HTTP batch",
    "DRAFTSCOPE_FLUSH_INTERVAL_S": "seconds between flushes of a partial batch (default 1.0)",
    "DRAFTSCOPE_MAX_QUEUE_ITEMS": "bounded queue size between hooks and the relay thread (default 4096)",
    "DRAFTSCOPE_HEALTH_INTERVAL_S": "seconds between health snapshots (default 10)",
    "DRAFTSCOPE_REDUCE": "where statistics are computed: auto (default: CPU tensors in the recorder process, "
                         "CUDA tensors on the device) or device (always the device summariser)",
    "DRAFTSCOPE_FAULT": "comma list of probes made to raise on purpose (testing the fault path)",
    "DRAFTSCOPE_SYNC_DEBUG": "1 runs every hook body under torch.cuda.set_sync_debug_mode('error'): a host sync "
                             "in the tracer fails its probe (counted, logged once); testing on CUDA",
}


REDUCE_MODES = ("auto", "device")  # DRAFTSCOPE_REDUCE; the first is the default


class ConfigError(ValueError):
    """A DRAFTSCOPE_* variable has a value the tracer cannot use."""


@dataclass(frozen=True)
class TracerConfig:
    url: Optional[str] = None
    db: Optional[str] = None
    file: Optional[str] = None
    sample_rate: float = 1 / 16
    step_stride: int = 1
    topk: int = 8
    ingest_token: Optional[str] = None
    flush_interval_s: float = 1.0
    max_queue_items: int = 4096
    max_batch_items: int = 256
    health_interval_s: float = 10.0
    probe_failure_limit: int = 5
    reduce: str = "auto"
    fault: frozenset = frozenset()
    sync_debug: bool = False
    models_root: Optional[str] = None  # recorded only as set or not (redact.TRACER_CONFIG_FIELDS)

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.db or self.file)

    def public(self) -> Dict[str, Any]:
        """The configuration as recorded in the run record: allow-listed fields, the URL without
        credentials (``redact_tracer_config``), whether a token is set but never the token."""
        return redact_tracer_config({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def safe_url(self) -> str:
        """``url`` as logs and records show it: no userinfo, query or fragment."""
        return public_url(self.url or "")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Optional["TracerConfig"]:
        """The config from DRAFTSCOPE_* variables, or None when the tracer is off."""
        if env.get("DRAFTSCOPE_DISABLE", "").strip() in ("1", "true", "yes"):
            return None
        url = env.get("DRAFTSCOPE_URL") or None
        db = env.get("DRAFTSCOPE_DB") or None
        file = env.get("DRAFTSCOPE_FILE") or None
        if not (url or db or file):
            return None
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"DRAFTSCOPE_URL={url!r} must start with http:// or https://")
        return cls(
            url=url.rstrip("/") if url else None,
            db=db,
            file=file,
            sample_rate=_rate(env.get("DRAFTSCOPE_SAMPLE_RATE", "1/16")),
            step_stride=_positive_int(env, "DRAFTSCOPE_STEP_STRIDE", 1),
            topk=_positive_int(env, "DRAFTSCOPE_TOPK", 8),
            ingest_token=env.get("DRAFTSCOPE_INGEST_TOKEN") or None,
            flush_interval_s=_positive_float(env, "DRAFTSCOPE_FLUSH_INTERVAL_S", 1.0),
            max_queue_items=_positive_int(env, "DRAFTSCOPE_MAX_QUEUE_ITEMS", 4096),
            health_interval_s=_positive_float(env, "DRAFTSCOPE_HEALTH_INTERVAL_S", 10.0),
            reduce=_choice(env, "DRAFTSCOPE_REDUCE", REDUCE_MODES),
            fault=frozenset(p.strip() for p in env.get("DRAFTSCOPE_FAULT", "").split(",") if p.strip()),
            sync_debug=env.get("DRAFTSCOPE_SYNC_DEBUG", "").strip() in ("1", "true", "yes"),
            models_root=env.get("DRAFTSCOPE_MODELS_ROOT") or None,
        )


def _rate(text: str) -> float:
    try:
        value = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"DRAFTSCOPE_SAMPLE_RATE={text!r} is not a number; use e.g. 1/16, 0.25 or 1") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"DRAFTSCOPE_SAMPLE_RATE={text!r} must lie in [0, 1]")
    return value


def _choice(env: Mapping[str, str], name: str, choices: tuple) -> str:
    text = (env.get(name) or choices[0]).strip()
    if text not in choices:
        raise ConfigError(f"{name}={text!r} must be one of: {', '.join(choices)}")
    return text


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{name}={text!r} must be >= 1")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"{name}={text!r} must be > 0")
    return value
