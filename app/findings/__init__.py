"""Diagnoses with stable rule ids (docs/findings.md): static ones from the draft, the target and
SGLang's expected behaviour; runtime ones from what the tracer observed. Also ``topk_gaps`` (verify steps
that lost their top-k, and why), ``fix`` (a finding's patch applied to a copy of a checkpoint) and
``doctor`` (``draftscope doctor``, standard library only). Pure rules over plain data: imports only
``spec`` and the plain modules."""

from draftscope.findings.model import Finding, Observation, SEVERITIES
from draftscope.findings.runtime import runtime_findings
from draftscope.findings.static import static_findings

__all__ = ["SEVERITIES", "Finding", "Observation", "runtime_findings", "static_findings"]
