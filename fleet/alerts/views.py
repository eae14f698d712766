"""The Alerts page: recent alerts, webhook endpoints with their deliveries, and (for staff with the permission)
adding an endpoint, a test alert, disabling and enabling."""

from urllib.parse import urlsplit

from django import forms
from django.contrib import messages
from django.db.models import Count, Max, Prefetch, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_POST

from fleet import demo
from fleet.alerts import notify, webhooks
from fleet.access import alerts_for, can, require_permission
from fleet.models import Alert, WebhookDelivery, WebhookEndpoint

RECENT_ALERTS = 50
RECENT_DELIVERIES = 5
MANAGE = "fleet.add_webhookendpoint"
CHANGE = "fleet.change_webhookendpoint"  # testing, disabling or enabling an endpoint someone else may rely on
State = WebhookDelivery.State


class EndpointForm(forms.Form):
    name = forms.CharField(max_length=100)
    url = forms.URLField(max_length=500, label="URL", assume_scheme="https")
    # A test goes to the endpoint it tests whatever kinds it takes: it is nothing to subscribe to.
    events = forms.MultipleChoiceField(choices=[(k, label) for k, label in Alert.Kind.choices if k != Alert.Kind.TEST],
                                       required=False, widget=forms.CheckboxSelectMultiple,
                                       help_text="None picked: every kind.")
    slack = forms.BooleanField(required=False, label="Slack-compatible body")

    def clean_url(self):
        url = self.cleaned_data["url"]
        if urlsplit(url).scheme.lower() not in ("http", "https"):
            raise forms.ValidationError("Use an http:// or https:// URL.")
        same = notify.endpoint_for(url)
        if same is not None:  # the URL itself is not repeated: a Slack URL's path is a secret
            state = "" if same.enabled else " (disabled: enable it instead)"
            raise forms.ValidationError(f"The endpoint {same.name!r} posts to this URL already{state}.")
        return url


def endpoint_rows():
    counts = {state: Count("deliveries", filter=Q(deliveries__state=state)) for state in State.values}
    recent = WebhookDelivery.objects.select_related("alert")[:RECENT_DELIVERIES]
    endpoints = list(WebhookEndpoint.objects.annotate(**{f"n_{state}": n for state, n in counts.items()},
                                                      last_delivery_at=Max("deliveries__created_at"))
                     .prefetch_related(Prefetch("deliveries", queryset=recent, to_attr="recent"))
                     .order_by("-enabled", "name", "id"))
    for endpoint in endpoints:
        endpoint.host = webhooks.shown_host(endpoint.url)  # a Slack URL's path and any user:password are secrets
        endpoint.last_error = next((d.last_error for d in endpoint.recent if d.last_error), "")
    return endpoints


def _page(request, *, form=None, created=None, secret=None, status=200):
    demo_receiver = demo.webhook_receiver_url()
    return render(request, "fleet/alerts.html", {
        "demo_receiver": demo_receiver,
        "created_on_demo": bool(created and demo_receiver and webhooks.is_demo_receiver(created.url, demo_receiver)),
        "alerts": alerts_for(request.user).select_related("instance")[:RECENT_ALERTS],
        "endpoints": endpoint_rows(),
        "can_manage": can(request.user, MANAGE),
        "can_change": can(request.user, CHANGE),
        "form": form or EndpointForm(),
        "created": created,
        "secret": secret,
    }, status=status)


def alert_list(request):
    return _page(request)


@require_POST
def add_endpoint(request):
    require_permission(request.user, MANAGE)
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    try:
        endpoint = notify.create_endpoint(**form.cleaned_data, by=request.user)
    except ValueError as exc:  # the address guard refused the URL's host
        form.add_error("url", str(exc))
        return _page(request, form=form, status=400)
    # Rendered, not redirected: the secret is shown in this one response and never again (nor kept by a cache).
    response = _page(request, created=endpoint, secret=endpoint.secret, status=201)
    patch_cache_control(response, no_store=True, private=True)
    return response


@require_POST
def send_test(request, pk):
    require_permission(request.user, CHANGE)
    endpoint = get_object_or_404(WebhookEndpoint, pk=pk)
    if not endpoint.enabled:
        messages.error(request, f"{endpoint.name} is disabled; enable it to send a test.")
    else:
        delivery = notify.send_test(endpoint, by=request.user)
        messages.success(request, f"Test alert {delivery.message_id} queued for {endpoint.name}.")
    return redirect("alerts")


@require_POST
def set_enabled(request, pk):
    require_permission(request.user, CHANGE)
    endpoint = get_object_or_404(WebhookEndpoint, pk=pk)
    enabled = request.POST.get("enabled") == "1"
    notify.set_enabled(endpoint, enabled, by=request.user)
    messages.success(request, f"{endpoint.name} is {'enabled' if enabled else 'disabled'}.")
    return redirect("alerts")
