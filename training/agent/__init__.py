"""The on-box agent (`python -m training.agent`): proves the install, restores the newest checkpoint that verifies,
fetches the data and model, runs the trainer, and while it trains forwards metrics, uploads checkpoints and
heartbeats; unrenewed, it stops the trainer and its own machine, so a dead dashboard cannot leave a box billing.
Imports no Django."""

from .dashboard import Api
from .exit_codes import Exit
from .manifests import manifest_of
from .resume import restore

__all__ = ["Api", "Exit", "manifest_of", "restore"]
