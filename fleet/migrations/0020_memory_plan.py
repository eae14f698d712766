from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("fleet", "0019_runpod_complete")]

    operations = []
