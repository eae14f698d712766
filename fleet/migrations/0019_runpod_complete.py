from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("fleet", "0018_vast_documented")]

    operations = []
