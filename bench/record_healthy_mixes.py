"""Record the healthy prompt mixes of bench/signature_false_alarms.py on the real CPU SGLang server:
the test bed's trained draft as built (scenario `healthy`), every request sampled, prompts of three
kinds (the demo's story openings, the tokenizer corpus' sentences, long joins of the demo prompts)
sent kind after kind, each prompt three times, so the prompts change kind along the run.

Three mixes: `healthy-mix-greedy` (temperature 0) and `healthy-mix-sampled` (temperature 0.8, the
same prompt accepting differently from one request to the next), and `healthy-mix-heldout` (other
prompts, 32 new tokens, temperature 0.6), recorded after the rules' thresholds were set on the first
two: the out-of-sample check. Tensor samples and top-k lists
are left out of the written file (the signatures read verify steps and requests only), which keeps
each under ~300 KiB. ~3-6 minutes per mix on two shared cores.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson

from testbed import scenarios
from testbed.server import start_server
from testbed.texts import DEMO_PROMPTS, TOKENIZER_CORPUS

KINDS = {
    "story": DEMO_PROMPTS,
    "corpus": TOKENIZER_CORPUS[:5],
    "long": [" ".join(DEMO_PROMPTS[i:] + DEMO_PROMPTS[:i]) * 3 for i in range(3)],
}
# held out: other prompts, lengths and sampling, recorded after the rules' thresholds were set
HELD_OUT = {
    "sentences": TOKENIZER_CORPUS[4:],
    "fragments": ["The quick", "A cat sat", "Numbers like", "In the beginning"],
    "longer": [" ".join(TOKENIZER_CORPUS[i:] + TOKENIZER_CORPUS[:i]) * 2 for i in range(3)],
}
REPEATS = 3
# name: (prompts by kind, sampling, new tokens)
MIXES = {"healthy-mix-greedy": (KINDS, {}, 24), "healthy-mix-sampled": (KINDS, {"temperature": 0.8}, 24),
         "healthy-mix-heldout": (HELD_OUT, {"temperature": 0.6}, 32)}
TRACER_ENV = {"DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_TOPK": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}


def record(name: str, out: Path, logs: Path) -> Path:
    prepared = scenarios.prepare("healthy")
    raw = logs / f"{name}.raw.jsonl"
    server = start_server(prepared.target_dir, prepared.draft_dir, prepared.server_args, logs / f"{name}.log",
                          env={**TRACER_ENV, "DRAFTSCOPE_FILE": str(raw)})
    kinds, sampling, new_tokens = MIXES[name]
    try:
        for prompts in kinds.values():
            for _ in range(REPEATS):
                for prompt in prompts:
                    server.generate(prompt, new_tokens, **sampling)
    finally:
        server.stop()
    trace = out / f"{name}.jsonl"
    with trace.open("wb") as f:
        for line in raw.read_bytes().splitlines():
            batch = orjson.loads(line)
            batch["samples"] = []
            batch["steps"] = [{k: v for k, v in s.items() if k not in ("draft_topk", "target_topk")}
                              for s in batch.get("steps", [])]
            f.write(orjson.dumps(batch) + b"\n")
    return trace


def record_all(out: Path, names: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="healthy-mixes-"))
    for name in names or MIXES:
        print(record(name, out, logs), flush=True)
