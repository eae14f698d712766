"""How the Celery tasks behave when a worker or the broker misbehaves: every task is bounded in time, Redis never hands
a waiting or running task out twice, a one-off task survives its worker process dying, and database connections are
checked before reuse."""

from django.conf import settings

from config.celery import app
from fleet import enqueue, tasks  # noqa: F401 (registers the fleet tasks)
from runs import tasks as run_tasks  # noqa: F401 (registers the run tasks)

ONE_OFF = {enqueue.RENT_INSTANCE, enqueue.DESTROY_INSTANCE, enqueue.MOVE_INSTANCE, enqueue.DELIVER_WEBHOOK}


def _ours() -> dict:
    return {name: task for name, task in app.tasks.items() if name.startswith(("fleet.", "runs."))}


def _retry_countdown_max(task) -> float:
    """The longest countdown Celery's autoretry gives a task's retry (its defaults where the task sets none)."""
    if getattr(task, "retry_backoff", False):
        return getattr(task, "retry_backoff_max", 600)
    return task.default_retry_delay


def test_it_bounds_every_task_with_a_soft_and_a_hard_time_limit():
    assert len(_ours()) >= 14
    unbounded = {name: (task.soft_time_limit, task.time_limit) for name, task in _ours().items()
                 if not (task.soft_time_limit and task.time_limit
                         and task.soft_time_limit < task.time_limit <= settings.TASK_TIME_LIMIT_MAX_S)}
    assert unbounded == {}


def test_it_keeps_redis_from_handing_a_waiting_or_running_task_out_twice():
    # A late-acked message is redelivered once the visibility timeout passes since it was sent: it must outlast the
    # longest countdown a task is sent with (a webhook's backoff, an autoretry's) plus the longest run.
    countdowns = [settings.WEBHOOK_BACKOFF_MAX_S] + [_retry_countdown_max(task) for task in _ours().values()
                                                     if getattr(task, "autoretry_for", ())]
    longest_run = max(task.time_limit for task in _ours().values())
    visibility = app.conf.broker_transport_options["visibility_timeout"]
    assert visibility > max(countdowns) + longest_run
    assert visibility == settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]


def test_it_requeues_a_one_off_task_whose_worker_process_died():
    for name in ONE_OFF:
        assert app.tasks[name].acks_late and app.tasks[name].reject_on_worker_lost, name
    # A periodic task is not requeued: beat sends the next one, and a requeued one would only run late and twice.
    periodic = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert not [name for name in periodic if app.tasks[name].reject_on_worker_lost]


def test_it_checks_a_kept_database_connection_before_reusing_it():
    database = settings.DATABASES["default"]
    assert database["CONN_MAX_AGE"] > 0 and database["CONN_HEALTH_CHECKS"] is True
