"""draftscope's dashboard, store and command line (import name ``draftscope``; the tracer is ``draftscope_tracer``).

Rooms, each a sub-package, from the bottom up; a room imports only the rooms below it (and the plain modules):

* plain modules: ``settings`` (the dashboard's settings), ``units`` (sizes and ages as people write them),
  ``redact`` (credentials out of stored free text), ``resources`` (where templates and static files are).
  Import nothing of draftscope but each other.
* ``spec/``: the draft's feature spec, the target's shape, what each engine makes of both, and the
  spec's diff and block for the pages. Pure functions over plain data and checkpoint headers.
* ``findings/``: the diagnoses with stable rule ids (static and runtime), ``topk_gaps``, the fixes
  (``fix``) and ``draftscope doctor``. Pure rules over plain data; may import ``spec``.
* ``store/``: the tables (``models``, ``tables``), the database and its migrations (``db``), ingest and
  its wire schema, the queries the pages read, per-run aggregates (``stats``), analysis, refresh,
  retention, the JSON-lines importer. May import ``findings`` and ``spec``.
* ``bundle/``: trace bundles: export, read, load. May import ``store``, ``findings``, ``spec``.
* ``web/``: the FastAPI app (``web.app.create_app``): pages, the JSON API, bundle downloads and uploads,
  metrics, health, access, guard. May import every room below it.
* ``cli/``: the ``draftscope`` console script (``cli.main``) and its sub-commands. May import every room.

Any room may import ``draftscope_tracer``'s plain modules and its wire format (``transport.wire``);
the tracer never imports draftscope. ``tests/test_rooms.py`` holds draftscope to these arrows.
"""
