from celery import shared_task

from runs import supervisor


@shared_task(expires=30, soft_time_limit=480, time_limit=540)  # a pass may rent a box for several runs
def supervise_runs() -> int:
    return supervisor.supervise()
