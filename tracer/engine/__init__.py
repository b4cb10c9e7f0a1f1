"""What the engines call. The engine core, here: ``core`` (the run record, the guard, the recorder started at
attach, the crashed run of an engine that refused to start, close), ``attachment`` (a plugin's hooks and its
tracer, ``detach``), ``hooks`` (owned hook handles), ``checkpoint`` (what is read of a draft checkpoint),
``sampling``, ``prompt_key``, ``shutdown``, ``environment``; and one folder per engine, each tracer built on the
core by composition: ``sglang/``, ``vllm/``.

The core imports ``transport`` and the plain modules (``config``, ``health``, ``stats``, ``shared``, ``redact``,
``model_paths``), never an engine's folder. An engine's folder imports the core, ``device``, ``transport`` and
the plain modules, never the other engine's folder."""
