from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0004_datasets"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="disk_gb",
            field=models.PositiveIntegerField(blank=True, help_text="the disk each of its boxes is rented with: at "
                                              "least what its model needs (fleet.instances.disk)", null=True),
        ),
    ]
