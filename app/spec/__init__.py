"""The draft's training-time feature spec, the target's shape, and what the serving engine (SGLang
0.5.23 or vLLM 0.32) will make of both.

Pure functions over plain data plus header-only checkpoint readers; no weights are loaded. ``diff``
compares two runs' specs, ``block`` gathers a run's spec for its page. Imports only the plain modules
(and ``draftscope_tracer.redact``).
"""

from draftscope.spec.draft import DraftFeatureSpec, read_draft
from draftscope.spec.engines import expect
from draftscope.spec.errors import SpecError
from draftscope.spec.expectations import ENGINES, Expectations
from draftscope.spec.sglang import expect_sglang, parse_server_args
from draftscope.spec.target import TargetSpec, read_target
from draftscope.spec.vocab_map import VocabMapCheck, check_vocab_map

__all__ = ["ENGINES", "DraftFeatureSpec", "Expectations", "SpecError", "TargetSpec", "VocabMapCheck",
           "check_vocab_map", "expect", "expect_sglang", "parse_server_args", "read_draft", "read_target"]
