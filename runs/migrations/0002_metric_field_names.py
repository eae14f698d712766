from django.db import migrations


class Migration(migrations.Migration):
    """The metric record's GiB figure is named in GiB, as training/metric_fields.py names it on the wire."""

    dependencies = [("runs", "0001_initial")]

    operations = [
        migrations.RenameField(model_name="metricpoint", old_name="gpu_mem_gb", new_name="gpu_mem_gib"),
    ]
