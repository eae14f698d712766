"""Instances: what rented boxes cost (`ledger`, `charges` reconciled with the provider's bill) and their pages
(`views`). Renting and destroying them happens in `fleet.actions` alone."""
