"""Server arguments a diagnosis needs, and nothing else (stdlib only).

``redact_server_args`` keeps an allow-list of SGLang 0.5.23 ``ServerArgs`` fields and vLLM 0.32's names
for the same (speculative settings, model and draft paths, dtypes, parallel sizes, attention backends,
CUDA-graph and scheduling settings), then drops any name that looks secret-shaped even if the allow-list
names it by mistake. ``redact_tracer_config`` does the same for the tracer's own configuration: named
fields of known types, the dashboard URL without userinfo, query or fragment. Both are used where the
tracer records a run and where the dashboard reads one, so a store written before them shows no more
than a new one.

``scrub`` takes secrets out of recorded values, whatever their name: in every string, a URL's userinfo
(``user:pass@``) and the value of every credential-like query parameter (``SECRET_PARAM_WORDS``) become
``<redacted>``, as does the credential after ``Bearer``/``Basic``. The tracer scrubs the run record it
sends (server args, facts, error messages); the dashboard scrubs again at ingest, on pages and in bundles.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, Mapping, Optional
from urllib.parse import urlsplit

# Whole families SGLang groups under one prefix (spec.py, CUDA-graph fields).
ALLOWED_PREFIXES = ("speculative_", "cuda_graph_")

ALLOWED = frozenset({
    # model and draft
    "model_path", "tokenizer_path", "revision", "served_model_name", "model_impl", "load_format",
    "json_model_override_args", "trust_remote_code", "is_embedding", "language_model_only",
    "enable_multi_layer_eagle", "aux_hidden_state_capture", "return_aux_hidden_state_layer_ids",
    "enable_return_aux_hidden_states", "enable_return_hidden_states", "return_hidden_states_mode",
    # numerics
    "dtype", "kv_cache_dtype", "quantization", "enable_fp32_lm_head", "enable_tf32_matmul",
    "triton_attention_reduce_in_fp32", "enable_deterministic_inference", "random_seed",
    # parallelism
    "device", "tp_size", "dp_size", "ep_size", "pp_size", "attn_cp_size", "attn_dp_size", "moe_dp_size",
    "dcp_size", "nnodes", "enable_dp_attention", "enable_dp_lm_head", "moe_dense_tp_size",
    "moe_runner_backend", "moe_a2a_backend",
    # kernels and backends
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "sampling_backend",
    "linear_attn_backend", "mm_attention_backend", "grammar_backend",
    # graphs and compilation
    "disable_cuda_graph", "disable_cuda_graph_padding", "disable_decode_cuda_graph",
    "disable_prefill_cuda_graph", "enable_torch_compile", "torch_compile_max_bs",
    "enable_profile_cuda_graph", "debug_cuda_graph",
    # scheduling and memory
    "context_length", "max_running_requests", "max_total_tokens", "max_prefill_tokens",
    "chunked_prefill_size", "page_size", "mem_fraction_static", "schedule_policy",
    "schedule_conservativeness", "disable_overlap_schedule", "enable_mixed_chunk",
    "disable_radix_cache", "num_continuous_decode_steps", "enable_two_batch_overlap",
    "enable_single_batch_overlap", "stream_interval", "skip_server_warmup", "log_level",
})
# vLLM 0.32's names for the same, read from its config objects (``engine/vllm/facts.py``; its
# ``speculative_config`` is a ``speculative_`` field)
VLLM_ALLOWED = frozenset({
    "model", "tokenizer", "seed", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "async_scheduling",
    "enable_prefix_caching", "enable_chunked_prefill", "block_size",
})

# Fragments that drop a name whatever the allow-list says: credentials, the verbatim command line,
# and SGLang's private copies of its input (``_raw_input`` holds every field again, secrets included).
DENIED_FRAGMENTS = ("key", "token", "secret", "password", "passwd", "credential", "auth",
                    "launch_command", "raw_input", "cookie")


def is_denied(name: str) -> bool:
    lowered = name.lower()
    if lowered.startswith("_"):
        return True
    # "max_prefill_tokens", "speculative_num_draft_tokens": counts of tokens, not tokens.
    lowered = lowered.replace("_tokens", "").replace("tokens_", "").replace("tokenizer", "")
    return any(fragment in lowered for fragment in DENIED_FRAGMENTS)


def is_allowed(name: str) -> bool:
    return (name in ALLOWED or name in VLLM_ALLOWED or name.startswith(ALLOWED_PREFIXES)) and not is_denied(name)


def _plain(value: Any) -> Any:
    """A JSON value; nested mappings lose their denied keys too, strings their credentials (``scrub``)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if not is_denied(str(k))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub(json.loads(json.dumps(value, default=str)))


def _overrides(entries: Any) -> Dict[str, Any]:
    """SGLang's ``_resolved_overrides``: ``[(source, {field: value}), ...]``, last writer wins."""
    merged: Dict[str, Any] = {}
    for entry in entries if isinstance(entries, (list, tuple)) else ():
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], Mapping):
            merged.update(entry[1])
    return merged


def redact_server_args(args: Mapping[str, Any]) -> Dict[str, Any]:
    """The allow-listed, non-secret server arguments in ``args``, as plain JSON values.

    ``args`` is a dict of ``ServerArgs`` fields, or a stored ``vars(server_args)`` from before this
    filter (SGLang 0.5.23 keeps its fields outside ``__dict__``; such a dict holds them only in the
    private ``_raw_input`` copy, with resolution's decisions in ``_resolved_overrides``). Both are read
    as fields, resolved values winning, and only allowed names come out.
    """
    args = dict(args)
    raw = args.get("_raw_input")
    fields = {**(raw if isinstance(raw, Mapping) else {}), **args, **_overrides(args.get("_resolved_overrides"))}
    return {str(name): _plain(value) for name, value in fields.items() if is_allowed(str(name))}


def redact_message(text: str, environ: Mapping[str, str]) -> str:
    """An exception message fit to record: the values of secret-shaped environment variables, URL
    userinfo, credential query parameters and bearer credentials (``scrub_text``) replaced by
    ``<redacted>``, at most 2000 characters."""
    for name, value in environ.items():
        if len(value) >= 6 and is_denied(name):
            text = text.replace(value, REDACTED)
    return scrub_text(text)[:2000]


REDACTED = "<redacted>"
# A query parameter (``?name=value``, ``&name=value``, ``;name=value``) holds a credential when one of
# the words of its name (split on ``_ - .`` and case changes, compared in lower case) is one of these:
# token (access_token, id_token, hf_token, X-Amz-Security-Token), key (key, api_key, apiKey), apikey,
# secret (client_secret), password, passwd, pwd, pass, sig and signature (Azure SAS, X-Amz-Signature,
# X-Goog-Signature), credential(s) (X-Amz-Credential, X-Goog-Credential), auth, authorization, jwt,
# session, sessionid.
SECRET_PARAM_WORDS = frozenset({
    "token", "key", "apikey", "secret", "password", "passwd", "pwd", "pass", "sig", "signature",
    "credential", "credentials", "auth", "authorization", "jwt", "session", "sessionid"})
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s]+@")  # to the authority's last @
_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&;#\s\"'<>()\[\]{}]*)")
# an HTTP credential after its scheme: 8 or more token characters, one of them a digit or + / = (not a word)
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<gap>\s+)"
                                r"(?=[A-Za-z0-9._~+/=\-]*[0-9+/=])[A-Za-z0-9._~+/=\-]{8,}")
_AUTH_HEADER = re.compile(r"(?i)(?P<head>\bauthorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?)[^\s\"',;()\[\]{}]+")
_MAYBE = re.compile(r"://|[?&;][A-Za-z0-9_.\-]+=|(?i:bearer|basic|authorization)")


def _param_words(name: str) -> list:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\-.]+", spaced.lower()) if w]


def _param(match: "re.Match[str]") -> str:
    if any(w in SECRET_PARAM_WORDS for w in _param_words(match.group("name"))) and match.group("value"):
        return match.group("head") + REDACTED
    return match.group(0)


def scrub_text(text: str) -> str:
    """``text`` with URL userinfo, credential query parameters' values (``SECRET_PARAM_WORDS``), an
    ``Authorization:`` header's value and ``Bearer``/``Basic`` credentials replaced by ``<redacted>``;
    anything else kept as it is."""
    if not _MAYBE.search(text):
        return text
    text = _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    text = _PARAM.sub(_param, text)
    text = _AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    return _SCHEME_CREDENTIAL.sub(lambda m: m.group("scheme") + m.group("gap") + REDACTED, text)


def scrub(value: Any) -> Any:
    """``value`` (a JSON-like value) with ``scrub_text`` applied to every string in it, mapping keys
    included; other values and the structure kept."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        return {scrub(k) if isinstance(k, str) else k: scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def public_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: no userinfo, query or fragment (a proxy's password
    or token rides there); "" when it is not a URL with a host."""
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:  # an unparseable netloc or port: keep nothing of it
        return ""
    if not parts.scheme or not host:
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port is not None else ''}{parts.path.rstrip('/')}"


def _url(value: Any) -> Optional[str]:
    return (public_url(value) or None) if isinstance(value, str) else None


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _number(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool:
    return bool(value)


def _names(value: Any) -> list:
    return sorted(str(v) for v in value) if isinstance(value, (list, tuple, set, frozenset)) else []


# The tracer's recorded configuration (``TracerConfig``'s fields), each with what may be kept of it.
# ``ingest_token`` records only whether one was set.
TRACER_CONFIG_FIELDS: Dict[str, Callable[[Any], Any]] = {
    "url": _url, "db": _text, "file": _text, "sample_rate": _number, "step_stride": _number,
    "topk": _number, "ingest_token": _flag, "flush_interval_s": _number, "max_queue_items": _number,
    "max_batch_items": _number, "health_interval_s": _number, "probe_failure_limit": _number,
    "reduce": _text, "fault": _names, "sync_debug": _flag,
    "models_root": _flag,  # whether model paths are relative to a models root, never the root itself
}


def redact_tracer_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The tracer configuration fit to record or show: the fields of ``TRACER_CONFIG_FIELDS`` that
    ``config`` holds, each reduced to what is safe (a stored one from before this filter included)."""
    return {name: keep(config[name]) for name, keep in TRACER_CONFIG_FIELDS.items() if name in config}
