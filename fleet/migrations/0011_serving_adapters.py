from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0010_run_recovering_alert"),
    ]

    operations = [
        migrations.AddField(
            model_name="inferencemodel",
            name="base_model",
            field=models.CharField(blank=True, help_text="the model vLLM loads under the adapter; empty: the name is "
                                                         "the model", max_length=300),
        ),
        migrations.AddField(
            model_name="inferencemodel",
            name="adapter_uri",
            field=models.CharField(blank=True, help_text="the folder of the adapter's files: s3://bucket/prefix/... or "
                                                         "a local path", max_length=600),
        ),
        migrations.AddField(
            model_name="inferencemodel",
            name="adapter_manifest",
            field=models.JSONField(blank=True, default=dict, help_text="{file name: {size, sha256}} of the adapter's "
                                                                       "files"),
        ),
        migrations.AddField(
            model_name="inferencemodel",
            name="adapter_source",
            field=models.CharField(blank=True, help_text="the run and checkpoint it comes from", max_length=300),
        ),
        migrations.AddField(
            model_name="inferencemodel",
            name="vram_needed_gb",
            field=models.FloatField(blank=True, help_text="per GPU, what offers are ranked with; empty: the profile's "
                                                          "recipe", null=True),
        ),
    ]
