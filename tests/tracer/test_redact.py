"""Server arguments are recorded through an allow-list; secret-shaped names never pass."""

import json

import pytest

from draftscope_tracer.engine.sglang.facts import server_args_facts
from draftscope_tracer.redact import ALLOWED, is_allowed, redact_server_args

SECRET = "ds-secret-9f2c41e7"


def _server_args(**overrides):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="/m/target", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path="/m/draft", api_key=SECRET, admin_api_key=SECRET,
                      ssl_keyfile_password=SECRET, watermark_key=SECRET, **overrides)


def test_live_server_args_keep_diagnosis_fields_and_no_secret():
    args = _server_args()
    args.__dict__["_launch_command"] = f"--api-key {SECRET}"
    args.__dict__["_raw_input"] = {"api_key": SECRET, "model_path": "/m/target"}
    args.__dict__["_resolved_overrides"] = [("spec", {"speculative_num_steps": 3})]
    got = server_args_facts(args)
    assert SECRET not in json.dumps(got)
    assert got["model_path"] == "/m/target" and got["speculative_draft_model_path"] == "/m/draft"
    assert got["speculative_algorithm"] == "EAGLE3" and got["speculative_num_steps"] == 3
    assert {"tp_size", "dtype", "attention_backend", "disable_cuda_graph", "context_length"} <= set(got)
    assert not any(k.startswith("_") for k in got)


def test_allow_list_names_real_fields():
    from sglang.srt.server_args import ServerArgs

    fields = set(ServerArgs.__struct_fields__)
    assert ALLOWED <= fields, sorted(ALLOWED - fields)
    secretish = [f for f in fields if any(w in f for w in ("key", "password", "secret"))]
    assert secretish and not any(is_allowed(f) for f in secretish)


@pytest.mark.parametrize("name", ["api_key", "admin_api_key", "ssl_keyfile", "ssl_keyfile_password",
                                  "watermark_key_b", "_launch_command", "_raw_input", "speculative_api_token",
                                  "cuda_graph_secret", "speculative_token_map"])
def test_denied_even_when_the_allow_list_would_take_it(name):
    assert redact_server_args({name: SECRET}) == {}


def test_old_stored_vars_dict_is_read_through_its_raw_copy():
    """A store from before the filter holds vars(server_args): only private keys, fields in _raw_input."""
    stored = {"_launch_command": f"--model-path /m --api-key {SECRET}",
              "_raw_input": {"model_path": "/m", "api_key": SECRET, "speculative_num_steps": None,
                             "speculative_adaptive_config": {"token": SECRET, "steps": 2}},
              "_resolved_overrides": [["spec", {"speculative_num_steps": 5}]], "_model_config": "<obj>"}
    got = redact_server_args(stored)
    assert got == {"model_path": "/m", "speculative_num_steps": 5, "speculative_adaptive_config": {"steps": 2}}


def test_exception_messages_lose_secret_values_and_url_credentials():
    from draftscope_tracer.redact import redact_message

    env = {"HF_TOKEN": "hf_abcdefghijklmnop", "MODEL_DIR": "/models/x", "SHORT_KEY": "ab"}
    text = "401 for https://user:pa55word@hub.example/m with hf_abcdefghijklmnop in /models/x " + "x" * 3000
    out = redact_message(text, env)
    assert "hf_abcdefghijklmnop" not in out and "pa55word" not in out and "/models/x" in out
    assert out.startswith("401 for https://<redacted>@hub.example/m with <redacted>") and len(out) == 2000


@pytest.mark.parametrize("text,expected", [
    ("https://user:pass@hub.example/x?token=abc", "https://<redacted>@hub.example/x?token=<redacted>"),
    ("s3://b/k?X-Amz-Credential=c&X-Amz-Date=1&X-Amz-Signature=s&X-Amz-Security-Token=t",
     "s3://b/k?X-Amz-Credential=<redacted>&X-Amz-Date=1&X-Amz-Signature=<redacted>&X-Amz-Security-Token=<redacted>"),
    ("https://a.blob.core.windows.net/c?sv=2022&sig=abc%3D&se=1", "https://a.blob.core.windows.net/c?sv=2022&sig=<redacted>&se=1"),
    ("http://h/?apiKey=k;access_token=t&client_secret=c&password=p&pwd=q", "http://h/?apiKey=<redacted>;access_token=<redacted>"
     "&client_secret=<redacted>&password=<redacted>&pwd=<redacted>"),
    ("https://ghp_abc123@github.com/o/r.git", "https://<redacted>@github.com/o/r.git"),
    ("redis://:pw@h:6379/0 and https://u:p@ss@h/x", "redis://<redacted>@h:6379/0 and https://<redacted>@h/x"),
    ("Authorization: Bearer abc.def-123", "Authorization: Bearer <redacted>"),
    ('{"Authorization": "Basic dXNlcjpwYXNz"}', '{"Authorization": "Basic <redacted>"}'),
    ("sent bearer hf_AbC123xyz", "sent bearer <redacted>"),
    # left as they are: no credential in them
    ("/models/Llama-3.1-8B?revision=main&max_tokens=5", "/models/Llama-3.1-8B?revision=main&max_tokens=5"),
    ("basic arithmetic failed; no authorization given", "basic arithmetic failed; no authorization given"),
    ("https://hub.example/x?keyframe=3&token=", "https://hub.example/x?keyframe=3&token="),
])
def test_credentials_in_values_are_scrubbed_whatever_the_name(text, expected):
    from draftscope_tracer.redact import scrub_text

    assert scrub_text(text) == expected


def test_scrub_reaches_every_string_and_keeps_the_rest():
    from draftscope_tracer.redact import scrub

    value = {"draft": {"path": "https://u:p@h/d"}, "list": ["x?token=t", 3, None, True],
             "https://u:p@h/": 1.5}
    assert scrub(value) == {"draft": {"path": "https://<redacted>@h/d"}, "list": ["x?token=<redacted>", 3, None, True],
                            "https://<redacted>@h/": 1.5}


def test_allow_listed_arguments_and_messages_lose_credentials_in_their_values():
    from draftscope_tracer.redact import redact_message

    got = redact_server_args({"speculative_draft_model_revision": "https://u:pw-1@hub/x?token=tk-1",
                              "model_path": "/m/t", "speculative_adaptive_config": {"url": "http://h/?sig=s-1"}})
    assert got == {"speculative_draft_model_revision": "https://<redacted>@hub/x?token=<redacted>", "model_path": "/m/t",
                   "speculative_adaptive_config": {"url": "http://h/?sig=<redacted>"}}
    out = redact_message("404 for https://hub.example/x?token=tk-2 (Authorization: Bearer ab12cd34ef)", {})
    assert out == "404 for https://hub.example/x?token=<redacted> (Authorization: Bearer <redacted>)"


def test_a_scrubbed_value_ends_where_the_credential_does():
    from draftscope_tracer.redact import scrub_text

    assert scrub_text("(see https://h/?token=abc) [key=x]") == "(see https://h/?token=<redacted>) [key=x]"
