"""draftscope's tracer: an SGLang plugin that samples what an EAGLE-3 draft receives (import name
``draftscope_tracer``; SGLang loads ``engine.plugin:register`` through the ``sglang.srt.plugins`` entry point,
vLLM ``engine.vllm_plugin:register`` through ``vllm.general_plugins``: a preview, docs/tracer.md).

Three layers, each a sub-package, and a few plain modules under them all:

* ``engine/``: what SGLang calls. The plugin and its hooks, the ``Tracer`` (attach, shutdown, per-request
  accounting) and its ``TensorProbes`` (what each hook records of the sampled rows), the facts read at
  attach; for vLLM ``vllm_plugin``, ``vllm_runtime``, ``vllm_facts`` and ``patches`` (its hooks are class
  patches: vLLM has no hook registry). May import ``device`` and ``transport``.
* ``device/``: what runs on the device. The capture object (summaries of sampled rows, the step tap inside
  the draft loop, the recomputed ``fc`` and draft logits) and the host copies that never wait for the GPU.
  May import only the plain modules.
* ``transport/``: what leaves the process. The outbox the hooks submit to, the relay thread, the recorder
  process that builds records, the writer and the sinks (HTTP, SQLite, file), the wire schema.
  May import only the plain modules.
* plain modules: ``config`` (the tracer's settings), ``health`` (drops, errors, heartbeats), ``stats``
  (summaries as plain data, numpy only), ``shared`` (values sent to the recorder once), ``redact`` (what of
  SGLang's and the tracer's own settings may be recorded: allow-lists), ``model_paths`` (model paths
  recorded relative to ``DRAFTSCOPE_MODELS_ROOT``). Import nothing of the tracer but each other.

``tests/tracer/test_layers.py`` holds the tracer to these arrows.
"""
