from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0011_serving_adapters"),
    ]

    operations = [
        migrations.AddField(
            model_name="offer",
            name="nvlink_gb_s",
            field=models.FloatField(blank=True, help_text="GB/s between its GPUs over NVLink; 0: PCIe only", null=True),
        ),
        migrations.AddField(
            model_name="offer",
            name="pcie_gb_s",
            field=models.FloatField(blank=True, help_text="GB/s of each GPU's PCIe link", null=True),
        ),
    ]
