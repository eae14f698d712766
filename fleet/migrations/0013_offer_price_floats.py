"""The float twins of each offer's prices (Offer.usd_per_hour_float and the three beside it), for the ranking:
added empty, worked out from the Decimals of the rows already stored, then required."""

from django.db import migrations, models

_TWINS = ("usd_per_hour_float", "storage_usd_per_gb_month_float", "inet_down_usd_per_gb_float",
          "inet_up_usd_per_gb_float")


def fill_price_floats(apps, schema_editor):
    # What fleet.ranking.offer_prices works out, written out here so that the migration keeps meaning what it did.
    Offer = apps.get_model("fleet", "Offer")
    rows = []
    for offer in Offer.objects.all().iterator(chunk_size=2000):
        offer.usd_per_hour_float = float(offer.gpu_usd_per_hour or offer.total_usd_per_hour)
        offer.storage_usd_per_gb_month_float = float(offer.storage_usd_per_gb_month)
        offer.inet_down_usd_per_gb_float = float(offer.inet_down_usd_per_gb)
        offer.inet_up_usd_per_gb_float = float(offer.inet_up_usd_per_gb)
        rows.append(offer)
        if len(rows) == 2000:
            Offer.objects.bulk_update(rows, _TWINS)
            rows = []
    Offer.objects.bulk_update(rows, _TWINS)


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0012_offer_interconnect"),
    ]

    operations = [
        *[migrations.AddField(model_name="offer", name=name, field=models.FloatField(null=True)) for name in _TWINS],
        migrations.RunPython(fill_price_floats, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="offer",
            name="usd_per_hour_float",
            field=models.FloatField(help_text="gpu_usd_per_hour, or total_usd_per_hour without one"),
        ),
        *[migrations.AlterField(model_name="offer", name=name, field=models.FloatField()) for name in _TWINS[1:]],
    ]
