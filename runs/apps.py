from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Training runs"

    def ready(self):
        """Tells fleet what a run does when its box is attached or found hung, and how a serving box reads a run's
        adapter, which boxes did a user's runs, and a run's evaluation numbers in its alerts (fleet.hooks: fleet
        cannot import runs)."""
        from fleet import hooks
        from runs import evaluations, serving, sharing, supervisor

        hooks.on_attach(supervisor.on_box_attached)
        hooks.on_move(supervisor.on_move)
        hooks.on_read_grant(serving.adapter_grant)
        hooks.on_boxes_of(sharing.boxes_of)
        hooks.on_alert_data(evaluations.alert_data)
        hooks.on_adapters_to_serve(serving.adapters_to_serve)
