"""The ``README.md`` inside a bundle: what it is, what it holds and leaves out, how to load it."""

from __future__ import annotations

from typing import Any

_ENGINE = {"sglang": "SGLang", "vllm": "vLLM"}


def readme_text(manifest: dict[str, Any]) -> str:
    counts, engine = manifest["counts"], manifest.get("engine") or "sglang"
    selected = ("all requests" if manifest["requests"] is None
                else f"{len(manifest['requests'])} selected request(s)")
    text = ("- `text.jsonl`: per request, the token ids its verify steps emitted and their text "
            "(exported with `--include-text`)\n" if manifest["include_text"] else "")
    return f"""# draftscope trace bundle

Run `{manifest['run_id']}` ({selected}), traced by draftscope inside {_ENGINE.get(engine, repr(engine))}
{manifest['versions'].get(engine)}, exported by {manifest['created_by']}. It shows what an
EAGLE-3 (or EAGLE) draft model received inside the server, verify step by verify step, and why
its drafts were accepted or rejected.

## Load it

    pip install 'draftscope[dashboard]'
    draftscope db upgrade
    draftscope import THIS_FILE.zip
    draftscope serve          # then open http://127.0.0.1:8177/

or upload it on a running dashboard's /import page. The import checks every member against the
sha256 in `manifest.json` and stores the run whole or not at all.

## What is inside

- `manifest.json`: bundle schema version {manifest['bundle_schema_version']}; versions
  (draftscope, SGLang, Python, torch, CUDA, driver) and hardware, where the tracer recorded them;
  SGLang's server args (an allow-list of those that matter for diagnosis); the draft's
  training-time feature spec; the findings; record counts; the sha256 and size of every member
- `run.json`: the run record (engine, models, attach-time facts)
- `requests.jsonl` ({counts['requests']}), `verify_steps.jsonl` ({counts['verify_steps']}),
  `tensor_samples.jsonl` ({counts['tensor_samples']}), `tracer_health.jsonl`
  ({counts['tracer_health']}), `findings.jsonl` ({counts['findings']}): one JSON record per line,
  fields as in draftscope's wire format (`draftscope_tracer/transport/wire.py`)
{text}
## What is not inside

- No prompt or output text unless exported with `--include-text` (this one: {'with' if manifest['include_text'] else 'without'}).
  Token ids of drafted, bonus and top-k tokens stay: they explain acceptance. The tracer never
  records prompts.
- No API keys, tokens, passwords or the server's launch command: server args pass an allow-list,
  and names that look secret are dropped from the facts.
- Paths under the exporting user's home directory are written `~/...` ({manifest['paths']}).

Read it without draftscope: `unzip` it; every `.jsonl` member is one JSON object per line
(e.g. `jq -s 'map(.accept_len) | add / length' verify_steps.jsonl`).
"""


