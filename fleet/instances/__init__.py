"""Instances: what rented boxes cost (`ledger`, `charges` reconciled with the provider's bill), the disk they are
rented with and how long a rent may wait. Renting and destroying them happens in `fleet.actions` alone, which builds
on this package; their pages, which act through it, are `fleet.instance_views`."""
