"""Offers: refreshing the marketplaces' listings into the database (`refresh`), ranking the stored ones for a recipe
and a saved profile (`ranked`, over the pure `fleet.ranking`), the throughput calibration that runs update, and the
Offers page (`views`, `forms`)."""
