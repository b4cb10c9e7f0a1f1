"""The dashboard's web face: the app (``app.create_app``), its pages (``pages``, ``templating``,
``charts``, ``facts_view``, ``engine_compare``, ``tokens``, ``csv_export``), the JSON API and ingest
route (``api``), bundle downloads and uploads (``bundles``), ``/metrics`` and ``/docs`` (``metrics``),
``/healthz`` (``healthz``), who may read (``access``, ``sessions``, ``login_throttle``) and what
another site may not do (``guard``, ``nul_guard``). Imports ``bundle``, ``store``, ``findings``,
``spec`` and the plain modules."""
