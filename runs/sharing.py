"""Whose runs, data sets and adapters a user sees: their own, every one for an operator (fleet.access.OPERATOR);
another's is a 404 as for none. Which s3:// objects a launch may read: none in the product's own storage but the
user's own data sets (README, "Who sees what")."""

from django.db.models import QuerySet

from fleet import access
from runs import storage
from runs.models import DataSet, DataSetName, Run, RunAttempt
from training import model_source

# Said alike whether the object exists or not: nothing in the product's storage is read before this check.
PRODUCT_STORAGE = ("lies in the product's own storage (runs' checkpoints and stored data sets), from which a launch "
                   "reads only a data set of yours (by its name, or its file's URI as the Data sets page shows it): "
                   "upload the file, or name an object outside it")


def is_operator(user) -> bool:
    return user is not None and access.is_operator(user)


def runs_for(user, runs: QuerySet | None = None) -> QuerySet:
    """The runs `user` launched; every run for an operator. A run launched by no one is an operator's only."""
    return access.owned(Run.objects.all() if runs is None else runs, user)


def run_or_404(user, pk, runs: QuerySet | None = None) -> Run:
    return access.owned_or_404(Run.objects.all() if runs is None else runs, user, pk)


def datasets_for(user, sets: QuerySet | None = None) -> QuerySet:
    """The data sets `user` stored under a name of theirs (DataSetName); every one for an operator. A row shared by
    two users who uploaded the same bytes is each one's."""
    sets = DataSet.objects.all() if sets is None else sets
    if is_operator(user):
        return sets
    return sets.filter(pk__in=DataSetName.objects.filter(user=user).values("dataset_id"))


def dataset_or_404(user, pk, sets: QuerySet | None = None) -> DataSet:
    return access.one_or_404(datasets_for(user, sets), pk)


def as_seen(datasets, user) -> list:
    """Each set as `user` may see it (shown_name, shown_uploader): under their own newest name, the uploader only if
    it is them. A row shared through the same bytes keeps its first uploader's name and login, which are not theirs
    to see; an operator sees the row's own."""
    datasets = list(datasets)
    if is_operator(user):
        for dataset in datasets:
            dataset.shown_name, dataset.shown_uploader = dataset.name, dataset.uploaded_by
        return datasets
    names = {}
    for dataset_id, name in (DataSetName.objects.filter(user=user, dataset__in=datasets)
                             .order_by("stored_at", "id").values_list("dataset_id", "name")):
        names[dataset_id] = name  # the newest wins
    for dataset in datasets:
        dataset.shown_name = names.get(dataset.pk, dataset.name)
        dataset.shown_uploader = dataset.uploaded_by if dataset.uploaded_by_id == user.pk else None
    return datasets


def boxes_of(user) -> QuerySet:
    """fleet.hooks.on_boxes_of: the boxes the user's own runs trained on."""
    return RunAttempt.objects.filter(run__created_by=user).values("instance_id")


def product_areas(bucket: str) -> set[tuple[str, str]]:
    """What the product writes in S3: under every run's and data set's bucket and the launch's own `bucket`."""
    buckets = {bucket, *Run.objects.filter(bucket__startswith="s3://").values_list("bucket", flat=True).distinct(),
               *DataSet.objects.filter(bucket__startswith="s3://").values_list("bucket", flat=True).distinct()}
    return storage.product_areas(buckets)


def model_in_product_storage(model: dict, bucket: str) -> bool:
    """Whether an s3:// model's prefix reaches into the product's storage: its listing and its boxes' GETs would then
    take other runs' checkpoints or data sets, whoever launches."""
    path = model.get("path") or ""
    if model_source.kind_of(path) != "s3" or model_source.s3_problem(path):
        return False
    return storage.in_areas(*model_source.s3_parts(path), product_areas(bucket))


def may_import(user, bucket_name: str, key: str, bucket: str) -> bool:
    """Whether a launch into `bucket` by `user` may read s3://bucket_name/key: anything outside the product's storage,
    inside it only the user's own data set's file (an operator's: any)."""
    if not storage.in_areas(bucket_name, key, product_areas(bucket)) or is_operator(user):
        return True
    folder, _, name = key.rpartition("/")
    if name != DataSet.FILE_NAME:
        return False
    own = DataSetName.objects.filter(user=user, dataset__uri=f"s3://{bucket_name}/{folder}/")
    return own.exists()
