from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0005_instance_machine"),
    ]

    operations = [
        migrations.AlterField(
            model_name="offer",
            name="offer_id",
            field=models.CharField(max_length=120),
        ),
    ]
