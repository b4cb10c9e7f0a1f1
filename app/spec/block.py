"""The draft's spec block (``describe_spec``) for a stored run, read from its draft and target
directories when they are readable from the dashboard host; cached per checkpoint identity."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from draftscope.spec import DraftFeatureSpec, SpecError, TargetSpec, engines, read_draft, read_target
from draftscope.spec.describe import SpecRow, describe_spec
from draftscope.spec.target import check_target_matches
from draftscope_tracer.redact import redact_server_args


MODELS_ROOT = "DRAFTSCOPE_MODELS_ROOT"


def model_dir(path: str | None) -> str | None:
    """The local folder of a recorded model path: an absolute path as it is; a path the tracer recorded
    relative to its models root (draftscope_tracer.model_paths) under this host's ``DRAFTSCOPE_MODELS_ROOT``;
    None when it is not a folder here (then the checkpoint is not read)."""
    if not path:
        return None
    root = os.environ.get(MODELS_ROOT)
    local = Path(path) if Path(path).is_absolute() else Path(root) / path if root else None
    return str(local) if local is not None and local.is_dir() else None


def static_spec(run: dict[str, Any], imported: tuple[DraftFeatureSpec, TargetSpec] | None = None
                ) -> tuple[list[SpecRow] | None, dict[str, Any] | None]:
    """(spec block rows, training-time feature statistics) of the run's draft, read from its
    directories when they are readable here, else from ``imported`` (the specs an imported
    bundle carried, ``draftscope.store.imported_spec.imported_spec``), else (None, None)."""
    facts = run.get("facts") or {}
    draft = (facts.get("draft") or {}).get("path") or run.get("draft_path")
    target = (facts.get("target") or {}).get("path") or run.get("target_path")
    args = redact_server_args(run.get("server_args") or {})
    args["speculative_algorithm"] = (run.get("algorithm") or facts.get("algorithm")
                                     or args.get("speculative_algorithm"))
    # As the findings see the server: its arguments and the override variables it started with.
    env = facts.get("sglang_env") if isinstance(facts.get("sglang_env"), dict) else {}
    served = json.dumps([engines.engine_of(facts), args, env], sort_keys=True, default=str)
    draft, target = model_dir(draft), model_dir(target)
    if draft and target:
        return _read(draft, target, run.get("draft_config_hash"), run.get("target_config_hash"),
                     served)
    if imported is None:
        return None, None
    spec, target_spec = imported
    return _describe(spec, target_spec, served), spec.feature_stats


@lru_cache(maxsize=64)
def _read(draft: str, target: str, _draft_hash: str | None, _target_hash: str | None,
          served: str) -> tuple[list[SpecRow] | None, dict[str, Any] | None]:
    try:
        target_spec = read_target(target)
        spec = read_draft(draft, target_layers=target_spec.num_layers)
        check_target_matches(spec, target_spec)
    except SpecError:
        return None, None
    return _describe(spec, target_spec, served), spec.feature_stats


def _describe(spec: DraftFeatureSpec, target: TargetSpec, served: str) -> list[SpecRow]:
    engine, args, env = json.loads(served)
    exp = engines.expect(engine, spec, target, {k: v for k, v in args.items() if v is not None}, env)
    return describe_spec(spec, target, exp)
