from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Training runs"

    def ready(self):
        """Tells fleet what a run does when its box is attached or found hung, and how a serving box reads a run's
        adapter, and which boxes did a user's runs (fleet.hooks: fleet cannot import runs)."""
        from fleet import hooks
        from runs import serving, sharing, supervisor

        hooks.on_attach(supervisor.on_box_attached)
        hooks.on_move(supervisor.on_move)
        hooks.on_read_grant(serving.adapter_grant)
        hooks.on_boxes_of(sharing.boxes_of)
