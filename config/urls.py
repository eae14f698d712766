from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from fleet import alert_views, instance_views
from fleet import views as fleet_views
from runs import views as run_views

urlpatterns = [
    path("", fleet_views.dashboard, name="dashboard"),
    path("offers/", fleet_views.offers, name="offers"),
    path("offers/profiles/", fleet_views.save_profile, name="save_profile"),
    path("instances/", instance_views.instance_list, name="instances"),
    path("instances/rent/", instance_views.rent_confirm, name="rent_confirm"),
    path("instances/<int:pk>/", instance_views.instance_detail, name="instance_detail"),
    path("instances/<int:pk>/destroy/", instance_views.destroy_confirm, name="destroy_confirm"),
    path("instances/<int:pk>/keep/", instance_views.keep_for_debugging, name="keep_for_debugging"),
    path("inference/", fleet_views.inference, name="inference"),
    path("alerts/", alert_views.alert_list, name="alerts"),
    path("alerts/endpoints/", alert_views.add_endpoint, name="add_webhook_endpoint"),
    path("alerts/endpoints/<int:pk>/test/", alert_views.send_test, name="test_webhook_endpoint"),
    path("alerts/endpoints/<int:pk>/enabled/", alert_views.set_enabled, name="enable_webhook_endpoint"),
    path("runs/", run_views.run_list, name="runs"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
