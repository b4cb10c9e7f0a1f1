"""A request's prompt key: equal for the same prompt within the tracer process, different for other
prompts, in the form ingest accepts, and carried by the finished request's record."""

from __future__ import annotations

import re
from types import SimpleNamespace

from draftscope_tracer.engine.sglang import requests
from draftscope_tracer.engine.prompt_key import prompt_key


def test_the_same_prompt_has_the_same_key_and_others_do_not():
    a, b = [1, 2, 3, 50000], [1, 2, 3, 50001]
    assert prompt_key(a) == prompt_key(list(a)) != prompt_key(b)
    assert prompt_key(a) != prompt_key(a[:3]) and re.fullmatch(r"[0-9a-f]{16}", prompt_key(a))


def test_the_key_is_no_plain_hash_of_the_ids():
    import hashlib
    from array import array

    ids = [5, 6, 7]
    plain = hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()
    assert prompt_key(ids) != plain  # keyed per process: a guessed prompt cannot be confirmed from the store


def test_a_finished_request_record_carries_its_prompt_key():
    req = SimpleNamespace(rid="r1", origin_input_ids=[9, 8, 7], output_ids=[1, 2], spec_verify_ct=2,
                          spec_num_correct_drafts=1, finished_reason=None)
    record, _ = requests.finished_record(req, True, None, 1.0, 4, now=2.0)
    assert record["prompt_key"] == prompt_key([9, 8, 7]) and record["prompt_len"] == 3
