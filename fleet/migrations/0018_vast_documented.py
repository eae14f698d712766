from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0017_inference_owner_operator")]

    operations = [
        migrations.AddField(
            model_name="offer",
            name="datacenter",
            field=models.BooleanField(blank=True, help_text="a datacenter host; blank: not said", null=True),
        ),
        migrations.AddField(
            model_name="offer",
            name="gpu_mem_bw_gb_s",
            field=models.FloatField(blank=True, help_text="each GPU's memory bandwidth, GB/s", null=True),
        ),
    ]
