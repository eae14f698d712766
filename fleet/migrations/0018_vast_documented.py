from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("fleet", "0017_inference_owner_operator")]

    operations = []
