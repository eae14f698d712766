import django.db.models.deletion
from django.db import migrations, models


def sealed_where_they_are(apps, schema_editor):
    """A checkpoint completed before attempt folders existed was uploaded straight into its sealed folder."""
    Checkpoint = apps.get_model("runs", "Checkpoint")
    for row in Checkpoint.objects.filter(complete=True, sealed_at=None).only("pk", "created_at").iterator():
        Checkpoint.objects.filter(pk=row.pk).update(sealed_at=row.created_at)
    # Nor did an attempt that ended before then have a folder of its own to empty.
    RunAttempt = apps.get_model("runs", "RunAttempt")
    RunAttempt.objects.exclude(ended_at=None).update(uploads_deleted_at=models.F("ended_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0008_attempt_model_grant'),
    ]

    operations = [
        migrations.AddField(
            model_name='runattempt',
            name='uploads_deleted_at',
            field=models.DateTimeField(blank=True, help_text='its attempt folder in the store was emptied then, its upload grants expired', null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='written_by',
            field=models.ForeignKey(blank=True, help_text='the attempt whose upload was checked against the manifest', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='runs.runattempt'),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='written_etags',
            field=models.JSONField(blank=True, help_text='{file name: ETag} listed when it was declared complete: the seal copies exactly those objects', null=True),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='sealed_at',
            field=models.DateTimeField(blank=True, help_text='copied then to the run\'s sealed folder, where no box can write; only a sealed checkpoint is resumed from or served', null=True),
        ),
        migrations.RunPython(sealed_where_they_are, migrations.RunPython.noop),
    ]
