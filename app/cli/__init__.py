"""The ``draftscope`` console script: ``main`` (the entry point; ``doctor`` runs from the base install),
``app`` (the typer app: ``serve``, ``import``, ``db``, and the sub-commands below), ``bundle``
(``export`` and the bundle half of ``import``), ``prune``, ``stats``. Imports every room."""
