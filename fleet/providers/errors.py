"""What can go wrong talking to a marketplace, in the user's words."""

from .fields import loose_text

# A marketplace's own words go into a message (its error text, a listing's fields), and every failure path stores it
# (rows, events, alerts): NUL and the other control characters PostgreSQL's text refuses become spaces, as in every
# other text read from a marketplace, and the length is bounded.
MESSAGE_LIMIT = 4000


class ProviderError(Exception):
    """A marketplace call failed; the message says why in words a user can act on, storable as it is."""

    def __init__(self, message: object = "", *args):
        super().__init__(loose_text(str(message), MESSAGE_LIMIT), *args)


class AuthenticationFailed(ProviderError):
    """The API key was refused (401/403): nothing will work until it is fixed, so never retried."""


class RateLimited(ProviderError):
    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ProviderUnavailable(ProviderError):
    """5xx answers, timeouts or refused connections that outlasted the retries."""


class EndpointRetired(ProviderError):
    """The marketplace answered 410 Gone: the API this client speaks was switched off. Nothing retries past it;
    the provider's client needs its port to the newer API."""


class MalformedResponse(ProviderError):
    """The marketplace answered with something that is not what its API documents."""


class OfferUnavailable(ProviderError):
    """The offer was rented by someone else or withdrawn between search and rent."""


class RequestRefused(ProviderError):
    """The marketplace refused the request itself (its arguments: an environment value too long, a start script
    over its limit), not the offer: every other offer would refuse it the same way, and the machine is not to
    blame."""


class InstanceNotFound(ProviderError):
    pass


class OutcomeUnknown(ProviderError):
    """A call that changes state (a rent) may or may not have happened: it timed out or got a 5xx after being
    sent. Retrying could rent twice; the caller must reconcile by label instead."""


class RentAnswerUnreadable(OutcomeUnknown, MalformedResponse):
    """The rent reached the marketplace and was accepted, but its answer names no machine: it may have rented, so
    reconcile by label (it is an OutcomeUnknown) and the answer broke the API's contract (a MalformedResponse)."""
