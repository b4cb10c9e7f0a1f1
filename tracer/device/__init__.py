"""What runs on the device: summaries of the sampled rows, the step tap, recomputes, host copies that never
wait for the GPU. Imports only the plain modules (``config``, ``health``, ``stats``, ``shared``,
``redact``, ``model_paths``)."""
