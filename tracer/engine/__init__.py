"""What SGLang calls: the plugin's hooks, the Tracer and its probes. Imports ``device``, ``transport`` and the
plain modules (``config``, ``health``, ``stats``, ``shared``, ``redact``, ``model_paths``)."""
