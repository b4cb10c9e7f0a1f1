"""draftscope's tracer: an SGLang plugin that samples what an EAGLE-3 draft receives (import name
``draftscope_tracer``; SGLang loads ``engine.sglang.plugin:register`` through the ``sglang.srt.plugins`` entry
point, vLLM ``engine.vllm.plugin:register`` through ``vllm.general_plugins``: a preview, docs/tracer.md).

Three layers, each a sub-package, and a few plain modules under them all:

* ``engine/``: what the engines call. The engine core (the run record, the guard, the recorder started at
  attach, start failure, close and crash, the plugins' attach and detach, the checkpoint reads) and one folder
  per engine, its tracer built on the core: ``sglang/`` (the plugin and its hooks, the ``Tracer`` and its
  ``TensorProbes``, the facts read at attach) and ``vllm/`` (the plugin, its class patches, the ``VLLMTracer``,
  its requests and engine-step probes, its facts). The core may import ``transport``; an engine's folder the
  core, ``device`` and ``transport``, never the other engine's.
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
