from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import path
from django.utils.functional import lazy
from django.views.generic import RedirectView

from config.dashboard import dashboard
from config.health import healthz
from fleet import instance_views
from fleet.alerts import views as alert_views
from fleet.inference import checkin_views
from fleet.inference import views as inference_views
from fleet.offers import views as offer_views
from runs import chart_views, dataset_views, evaluation_views, prometheus
from runs import views as run_views
from runs.api import api as agent_api


def _without_login(patterns):
    """The agent API authenticates boxes by their run token, not by a dashboard login."""
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            _without_login(pattern.url_patterns)
        else:
            pattern.callback.login_required = False
    return patterns

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("offers/", offer_views.offers, name="offers"),
    path("offers/profiles/", offer_views.save_profile, name="save_profile"),
    path("offers/profiles/<int:pk>/delete/", offer_views.delete_profile, name="delete_profile"),
    path("instances/", instance_views.instance_list, name="instances"),
    path("instances/rent/", instance_views.rent_confirm, name="rent_confirm"),
    path("instances/<int:pk>/", instance_views.instance_detail, name="instance_detail"),
    path("instances/<int:pk>/destroy/", instance_views.destroy_confirm, name="destroy_confirm"),
    path("instances/<int:pk>/keep/", instance_views.keep_for_debugging, name="keep_for_debugging"),
    path("inference/", inference_views.inference, name="inference"),
    path("inference/<int:pk>/replicas/", inference_views.set_desired_replicas, name="inference_replicas"),
    path("inference/models/new/", inference_views.add_model, name="inference_model_add"),
    path("inference/models/<int:pk>/", inference_views.change_model, name="inference_model_change"),
    path("alerts/", alert_views.alert_list, name="alerts"),
    path("alerts/endpoints/", alert_views.add_endpoint, name="add_webhook_endpoint"),
    path("alerts/endpoints/<int:pk>/test/", alert_views.send_test, name="test_webhook_endpoint"),
    path("alerts/endpoints/<int:pk>/enabled/", alert_views.set_enabled, name="enable_webhook_endpoint"),
    path("runs/", run_views.run_list, name="runs"),
    path("runs/launch/", run_views.run_launch, name="run_launch"),
    path("runs/<int:pk>/", run_views.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", run_views.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/serve/", run_views.run_serve, name="run_serve"),
    path("runs/<int:pk>/charts.json", chart_views.run_chart_data, name="run_chart_data"),
    path("runs/<int:pk>/metrics.csv", chart_views.run_metrics_csv, name="run_metrics_csv"),
    path("runs/<int:pk>/evaluation.csv", evaluation_views.evaluation_csv, name="run_evaluation_csv"),
    path("runs/<int:pk>/evaluate/", evaluation_views.run_evaluate, name="run_evaluate"),
    path("runs/compare/", chart_views.compare, name="run_compare"),
    path("datasets/", dataset_views.dataset_list, name="datasets"),
    path("datasets/<int:pk>/", dataset_views.dataset_detail, name="dataset_detail"),
    path("metrics", prometheus.prometheus_metrics, name="prometheus_metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name no icon (the admin's, a JSON answer).
    path("favicon.ico", login_not_required(RedirectView.as_view(url=lazy(static, str)("favicon.svg"), permanent=True)),
         name="favicon"),
    path("api/agent/v1/", (_without_login(agent_api.urls[0]), *agent_api.urls[1:])),
    path("api/serving/v1/instances/<int:pk>/checkin", checkin_views.checkin_view, name="serving_checkin"),
]

# A request too large to read gets a page that says the limit (config/too_large.py); other 400s are Django's.
handler400 = "config.too_large.bad_request"
