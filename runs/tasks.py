from celery import shared_task


@shared_task(expires=30)
def supervise_runs() -> int:
    from runs import supervisor

    return supervisor.supervise()
