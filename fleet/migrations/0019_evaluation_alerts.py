"""The alerts a run's evaluation sends: run.evaluated and run.promoted."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0018_vast_documented'),
    ]

    operations = [
        migrations.AlterField(
            model_name='alert',
            name='kind',
            field=models.CharField(choices=[('instance.rented', 'Instance Rented'), ('instance.destroyed', 'Instance Destroyed'), ('instance.failed', 'Instance Failed'), ('instance.reaped', 'Instance Reaped'), ('instance.adopted', 'Instance Adopted'), ('instance.destroy_unconfirmed', 'Destroy Unconfirmed'), ('provider.failing', 'Provider Failing'), ('probe.failing', 'Probe Failing'), ('spend_cap.hit', 'Spend Cap Hit'), ('run.recovering', 'Run Recovering'), ('run.failed', 'Run Failed'), ('run.finished', 'Run Finished'), ('run.cancelled', 'Run Cancelled'), ('run.evaluated', 'Run Evaluated'), ('run.promoted', 'Run Promoted'), ('test', 'Test')], max_length=40),
        ),
    ]
