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
        migrations.AddField(
            model_name="instance",
            name="bid_cap_usd_per_hour",
            field=models.DecimalField(
                blank=True, decimal_places=6, max_digits=12, null=True,
                help_text="an outbid box raises its bid while the rental stays within this $/h; blank: it moves"),
        ),
    ]
