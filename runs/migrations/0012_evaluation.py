from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_router_load")]

    operations = []
