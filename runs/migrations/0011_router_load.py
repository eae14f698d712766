from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_phase_kind_metrics")]

    operations = []
