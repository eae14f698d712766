from celery import shared_task

from runs import supervisor


@shared_task(expires=30)
def supervise_runs() -> int:
    return supervisor.supervise()
