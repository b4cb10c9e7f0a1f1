"""The bundle format (schema version 1): member names, limits, and the manifest's schema.

A bundle is a zip holding ``manifest.json``, ``README.md``, ``run.json`` (the run record) and one
JSON-lines member per record table, each line one record with the fields of
``draftscope_tracer.transport.wire`` (the tracer's wire format), plus ``text.jsonl`` when exported with
``--include-text``. docs/bundles.md describes every member.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BUNDLE_SCHEMA_VERSION = 1
SUPPORTED_BUNDLE_VERSIONS = (BUNDLE_SCHEMA_VERSION,)

MANIFEST = "manifest.json"
README = "README.md"
RUN = "run.json"
TEXT = "text.jsonl"
# Store table -> member, in the order records are stored on import.
TABLE_MEMBERS = {"requests": "requests.jsonl", "verify_steps": "verify_steps.jsonl",
                 "tensor_samples": "tensor_samples.jsonl", "tracer_health": "tracer_health.jsonl",
                 "findings": "findings.jsonl"}
# Store table -> key of the wire batch that carries its records.
BATCH_KEYS = {"requests": "requests", "verify_steps": "steps", "tensor_samples": "samples",
              "tracer_health": "health", "findings": "findings"}
KNOWN_MEMBERS = (MANIFEST, README, RUN, TEXT, *TABLE_MEMBERS.values())
REQUIRED_MEMBERS = (MANIFEST, RUN, *TABLE_MEMBERS.values())


class Limits(BaseModel):
    """What the reader accepts before it decompresses anything (zip bombs, oversized members)."""

    max_members: int = 32
    max_manifest_bytes: int = 64 * 1024 * 1024
    max_member_bytes: int = 2 * 1024**3  # uncompressed, each
    max_total_bytes: int = 4 * 1024**3  # uncompressed, all members together
    max_ratio: float = 200.0  # uncompressed / compressed, for members over ratio_floor_bytes
    ratio_floor_bytes: int = 1024 * 1024


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class FeatureSpec(BaseModel):
    """The draft's training-time feature spec and the target's shape, as read at export time."""

    model_config = ConfigDict(extra="forbid")

    draft: dict[str, Any] | None
    target: dict[str, Any] | None
    unavailable: str | None = None  # why draft/target are null


class Manifest(BaseModel):
    """``manifest.json``. Everything here is also shown to whoever imports the bundle."""

    model_config = ConfigDict(extra="forbid")

    bundle_schema_version: int
    wire_schema_version: int
    created_at: float
    created_by: str  # "draftscope <version>"
    run_id: str = Field(min_length=1, max_length=200)
    engine: Literal["sglang", "vllm"] = "sglang"  # the serving engine that recorded the run (older bundles: SGLang's)
    requests: list[str] | None  # the requests selected at export (None: all of them)
    include_text: bool
    paths: Literal["shortened", "kept"]
    versions: dict[str, str | None]  # draftscope, the engine (sglang or vllm), python, torch, cuda, driver
    hardware: dict[str, Any] | None
    server_args: dict[str, Any]  # redacted
    feature_spec: FeatureSpec
    findings: list[dict[str, Any]]
    counts: dict[str, int]  # records per table
    members: dict[str, Member]  # every other member: its sha256 and size in bytes
