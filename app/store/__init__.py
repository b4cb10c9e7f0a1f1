"""The store: its tables (``models``; ``tables`` names each as a Core table once), the database and its
migrations (``db``), ingest (``ingest``, ``ingest_checks``, ``wire_schema``), what the pages read
(``queries``), per-run aggregates (``stats``), a run's diagnosis (``analyze``) and its refresh thread
(``refresh``; which runs are due: ``refresh_schedule``; what failed since when: ``refresh_failures``),
retention, the spec an imported bundle carried (``imported_spec``) and the JSON-lines importer
(``importer``). Imports ``findings``, ``spec`` and the plain modules."""
