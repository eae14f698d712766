"""Fleet models, one file per subject: offers and ranking, instances and their ledger,
the inference fleet and its probes, alerts and their webhooks."""

from .alerts import Alert, WebhookDelivery, WebhookEndpoint
from .inference import InferenceModel, ProbeResult
from .instances import CostSegment, Instance, InstanceEvent
from .offers import Offer, OfferProfile, OfferRefresh, ThroughputCalibration

__all__ = ["Alert", "CostSegment", "InferenceModel", "Instance", "InstanceEvent", "Offer", "OfferProfile",
           "OfferRefresh", "ProbeResult", "ThroughputCalibration", "WebhookDelivery", "WebhookEndpoint"]
