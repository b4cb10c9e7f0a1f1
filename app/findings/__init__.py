"""Diagnoses with stable rule ids (docs/findings.md): static ones from the draft, the target and
SGLang's expected behaviour; runtime ones from what the tracer observed."""

from draftscope.findings.model import SEVERITIES, Finding, Observation
from draftscope.findings.runtime import runtime_findings
from draftscope.findings.static import static_findings

__all__ = ["SEVERITIES", "Finding", "Observation", "runtime_findings", "static_findings"]
