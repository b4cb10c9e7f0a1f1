"""The msgspec fast path of ingest accepts exactly what the pydantic wire schema accepts."""

from __future__ import annotations

import json

import msgspec
import pytest

from draftscope.ingest import IngestError, parse_batch
from draftscope.wire_schema import Batch, FastBatch
from tests.fixtures.store import make_batch, run_record, sample_record, step_record

DECODE = msgspec.json.Decoder(FastBatch)


def full_batch() -> dict:
    return make_batch("run-1", run=run_record(server_args={"tp_size": 1}),
                      requests=[{"rid": "a", "prompt_len": 3}], steps=[step_record("a", 0)],
                      samples=[sample_record(0), sample_record(1, rid=None, mean=None)],
                      health=[{"at": 1.0, "drops": {}, "errors": {}, "heartbeats": {"verify": 1},
                               "disabled_probes": []}],
                      findings=[{"rule_id": "r", "severity": "info", "message": "m"}])


def test_fast_path_decodes_like_pydantic() -> None:
    body = json.dumps(full_batch()).encode()
    assert msgspec.to_builtins(DECODE.decode(body)) == Batch.model_validate_json(body).model_dump()


@pytest.mark.parametrize("change", [
    lambda b: b["samples"][0].update(width="12288"),      # string for a number
    lambda b: b["samples"][0].update(width=1.5),          # float for an int
    lambda b: b["steps"][0].update(accept_flags=[1, 0]),  # ints for booleans
    lambda b: b["requests"][0].update(colour="red"),      # unknown field
    lambda b: b["steps"][0].pop("accept_len"),            # missing field
    lambda b: b.update(run_id=""),                        # empty id
    lambda b: b.update(batch_id="x" * 201),               # overlong id
    lambda b: b["run"].update(facts=[1]),                 # list for an object
])
def test_fast_path_rejects_what_pydantic_rejects(change) -> None:
    batch = full_batch()
    change(batch)
    body = json.dumps(batch).encode()
    with pytest.raises(msgspec.ValidationError):
        DECODE.decode(body)
    with pytest.raises(IngestError) as error:
        parse_batch(body)
    assert error.value.status == 422 and "wire schema" in error.value.message


def test_nan_literals_fall_back_to_pydantic_and_are_kept() -> None:
    body = json.dumps(make_batch("run-1", samples=[sample_record(0, l2_mean=float("nan"))])).encode()
    batch = parse_batch(body)
    assert batch.samples[0].l2_mean != batch.samples[0].l2_mean  # NaN
