from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Training runs"

    def ready(self):
        from fleet import actions
        from runs import supervisor

        if supervisor.on_move not in actions.MOVE_HANDLERS:
            actions.MOVE_HANDLERS.append(supervisor.on_move)
