"""The Content-Security-Policy header, on every response: scripts only from the dashboard's own static files, nothing
framed, posted or based elsewhere (docs/runs.md, "config/csp.py")."""

DIRECTIVES = {
    "default-src": "'self'",
    "script-src": "'self'",  # no inline script, no eval: every script is a file under static/
    # Plotly and htmx add <style> elements and style attributes as they draw, and templates set style attributes
    # (the dashboard's spend meter); a style cannot run script.
    "style-src": "'self' 'unsafe-inline'",
    # Plotly's "download plot as png" draws the chart's SVG through an image made from a data: or blob: URL.
    "img-src": "'self' data: blob:",
    "object-src": "'none'",
    "base-uri": "'self'",
    "frame-ancestors": "'none'",
    "form-action": "'self'",
}
POLICY = "; ".join(f"{name} {sources}" for name, sources in DIRECTIVES.items())


class ContentSecurityPolicyMiddleware:
    """Sets the policy on every response, static files and error pages included (first in MIDDLEWARE)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers["Content-Security-Policy"] = POLICY
        return response
