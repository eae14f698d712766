from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from fleet import views as fleet_views
from runs import views as run_views

urlpatterns = [
    path("", fleet_views.dashboard, name="dashboard"),
    path("offers/", fleet_views.offers, name="offers"),
    path("offers/profiles/", fleet_views.save_profile, name="save_profile"),
    path("instances/", fleet_views.instances, name="instances"),
    path("inference/", fleet_views.inference, name="inference"),
    path("alerts/", fleet_views.alerts, name="alerts"),
    path("runs/", run_views.run_list, name="runs"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
