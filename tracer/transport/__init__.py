"""What leaves the process: the outbox, the relay to the recorder process, records, the writer, the sinks,
the wire schema, redaction. Imports only the plain modules (``config``, ``health``, ``stats``, ``shared``)."""
