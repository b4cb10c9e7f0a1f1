"""Trace bundles: one zip that carries a run to another dashboard, with nothing private inside.

``export`` writes a bundle from the store (read only), ``reader`` opens and validates one without
writing anything, ``loader`` stores a validated bundle in one transaction. The format is in
``format`` and in docs/bundles.md. The command line and the web routes that use them are in
``cli.bundle`` and ``web.bundles``. Imports ``store``, ``findings``, ``spec`` and the plain modules.
"""
