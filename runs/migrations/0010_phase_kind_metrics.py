from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_checkpoint_sealing")]

    operations = []
