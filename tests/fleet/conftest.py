# The marketplace fixtures live in tests/marketplace.py (registered by tests/conftest.py); these names are
# imported from here by the fleet tests.
from tests.marketplace import MARKET_KEY, sim_now  # noqa: F401

