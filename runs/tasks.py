from celery import shared_task

from fleet import enqueue
from runs import checkpoints, model_manifests, supervisor


@shared_task(expires=30, soft_time_limit=480, time_limit=540)  # a pass may rent a box for several runs
def supervise_runs() -> int:
    return supervisor.supervise()


@shared_task(soft_time_limit=540, time_limit=570)  # server-side copies: minutes for many GB
def seal_checkpoint(checkpoint_id: int) -> bool:
    return checkpoints.seal(checkpoint_id)


@shared_task(soft_time_limit=540, time_limit=570)  # a few files each; the rest goes to the next task
def record_model_manifest(uri: str) -> bool:
    done = model_manifests.record(uri)
    if not done:
        enqueue.record_model_manifest(uri)
    return done
