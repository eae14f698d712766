"""A simulated vast.ai marketplace: a real local HTTP server speaking vast.ai's REST subset (see README.md).

Standard library only, and nothing from the rest of the project: it runs on its own (`python -m fleet.simulator`).
"""

from .hooks import InstanceHooks
from .market import Market, MarketError, Settings
from .marketplace import SimulatedMarketplace

__all__ = ["InstanceHooks", "Market", "MarketError", "Settings", "SimulatedMarketplace"]
