"""What runs on the device: summaries of the sampled rows, the step tap, recomputes, host copies that never
wait for the GPU. A summary goes launch -> ring slot -> record: ``summaries`` picks the layout's ``Summarizer``
and stages the rows (``devicecopy``), ``summarize`` launches (its inputs checked by ``summary_checks``) into a
slot of its ring (``summary_ring``: the slot is the launch's ``Pending``, issued once, marked for its reader, who
records the event it waits on: ``devicecopy.mark_later``), the relay reads it for the records.
Imports only the plain modules (``config``, ``health``, ``stats``, ``shared``, ``redact``, ``model_paths``)."""
