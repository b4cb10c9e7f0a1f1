"""The draft's training-time feature spec, the target's shape, and what SGLang will make of both.

Pure functions over plain data plus header-only checkpoint readers; no weights are loaded.
"""

from draftscope.spec.draft import DraftFeatureSpec, read_draft
from draftscope.spec.errors import SpecError
from draftscope.spec.sglang import SGLangExpectations, expect_sglang, parse_server_args
from draftscope.spec.target import TargetSpec, read_target
from draftscope.spec.vocab_map import VocabMapCheck, check_vocab_map

__all__ = ["DraftFeatureSpec", "SGLangExpectations", "SpecError", "TargetSpec", "VocabMapCheck",
           "check_vocab_map", "expect_sglang", "parse_server_args", "read_draft", "read_target"]
