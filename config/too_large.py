"""The page for a request too large to read (a form's fields over DATA_UPLOAD_MAX_MEMORY_SIZE, too many fields or
files): it says the limit and that nothing was stored, instead of a bare "Bad Request (400)"."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import defaults

from training.recipe import MAX_RECIPE_CHARS

# What is read of the rest of a refused body before answering, so the browser, still sending, reads the answer
# instead of a closed connection; a larger rest is left unread.
DRAIN_BYTES = 64 * 1024 * 1024


def bad_request(request, exception=None):
    if not isinstance(exception, (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)):
        return defaults.bad_request(request, exception)
    _drain(request)
    return render(request, "too_large.html", {
        "fields_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE, "max_fields": settings.DATA_UPLOAD_MAX_NUMBER_FIELDS,
        "max_files": settings.DATA_UPLOAD_MAX_NUMBER_FILES, "recipe_chars": MAX_RECIPE_CHARS,
        "too_many": None if isinstance(exception, RequestDataTooBig) else str(exception),
        "launching": request.path == reverse("run_launch"), "form_page": _form_page(request),
    }, status=413)


def _form_page(request) -> str:
    """Where the refused form was: the page it came from, on this dashboard; the launch page posts to itself."""
    if request.path == reverse("run_launch"):
        return request.path
    referer = request.headers.get("Referer", "")
    return referer if url_has_allowed_host_and_scheme(referer, {request.get_host()}, request.is_secure()) else ""


def _drain(request) -> None:
    stream = getattr(request, "_stream", None)
    left = DRAIN_BYTES
    try:
        while stream is not None and left > 0 and (chunk := stream.read(min(left, 1024 * 1024))):
            left -= len(chunk)
    except OSError:  # the browser went away
        pass
