from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0020_instance_volume")]

    operations = [
        migrations.AddField(
            model_name="offer",
            name="cpu_ram_gb",
            field=models.FloatField(blank=True, help_text="the host memory the rental gets; blank: not said", null=True),
        ),
    ]
