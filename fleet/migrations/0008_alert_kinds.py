from django.db import migrations, models


class Migration(migrations.Migration):
    """Alerts of their own kind for a cancelled run and for the Alerts page's test; plural names the admin spells
    right (offer refreshes, webhook deliveries)."""

    dependencies = [
        ("fleet", "0006_offer_bounds"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="offerrefresh",
            options={"get_latest_by": "started_at", "verbose_name_plural": "offer refreshes"},
        ),
        migrations.AlterModelOptions(
            name="webhookdelivery",
            options={"ordering": ["-created_at", "-id"], "verbose_name_plural": "webhook deliveries"},
        ),
        migrations.AlterField(
            model_name="alert",
            name="kind",
            field=models.CharField(choices=[
                ("instance.rented", "Instance Rented"), ("instance.destroyed", "Instance Destroyed"),
                ("instance.failed", "Instance Failed"), ("instance.reaped", "Instance Reaped"),
                ("instance.adopted", "Instance Adopted"), ("instance.destroy_unconfirmed", "Destroy Unconfirmed"),
                ("probe.failing", "Probe Failing"), ("spend_cap.hit", "Spend Cap Hit"), ("run.failed", "Run Failed"),
                ("run.finished", "Run Finished"), ("run.cancelled", "Run Cancelled"), ("test", "Test"),
            ], max_length=40),
        ),
    ]
