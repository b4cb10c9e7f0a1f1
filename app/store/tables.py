"""The store's tables as SQLAlchemy Core tables, named once for the queries and writers that use them."""

from __future__ import annotations

from draftscope.store import models

RUNS = models.Run.__table__
REQUESTS = models.Request.__table__
STEPS = models.VerifyStep.__table__
SAMPLES = models.TensorSample.__table__
HEALTH = models.TracerHealth.__table__
FINDINGS = models.Finding.__table__
BATCHES = models.IngestBatch.__table__
IMPORTS = models.BundleImport.__table__
STATS = models.RunStats.__table__
BINS = models.RunStatBin.__table__
SESSIONS = models.LoginSession.__table__
