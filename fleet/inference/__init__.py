"""The inference fleet: keeping each model's replicas rented (`replicas`), probing their `/v1/models` (`probes`),
and its page (`views`)."""
