"""What leaves the process: the outbox, the relay to the recorder process, records, the writer, the sinks,
the wire schema (``wire``). Imports only the plain modules (``config``, ``health``, ``stats``, ``shared``,
``model_paths``, and ``redact``: what of the settings may be recorded is decided there, not here)."""
