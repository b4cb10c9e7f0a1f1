"""SGLang's tracer: the plugin and its hooks (``plugin``, entry point ``sglang.srt.plugins``), the ``Tracer``
(attach, per-request accounting) and its ``TensorProbes`` (each hook's work on the sampled rows: ``features``,
what the draft receives; ``draft_topk``, the draft's top-k until its verify), the sampled requests
(``requests``), the facts read at attach (``facts``) and the hooks accounted for (``coverage``). Imports the
engine core, ``device``, ``transport`` and the plain modules."""
