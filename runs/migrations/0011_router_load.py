import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_phase_kind_metrics")]

    operations = [
        migrations.AddField(model_name="metricpoint", name="router_max_mean", field=models.FloatField(null=True)),
        migrations.AddField(model_name="metricpoint", name="router_idle_experts",
                            field=models.PositiveIntegerField(null=True)),
        migrations.CreateModel(
            name="RouterLoad",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("phase", models.PositiveSmallIntegerField()),
                ("step", models.PositiveIntegerField(help_text="the interval's last step")),
                ("at", models.DateTimeField()),
                ("counts", models.JSONField(help_text="[[count of expert 0, 1, ...] of MoE layer 0, ...], "
                                                      "non-negative integers")),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="router_loads",
                                          to="runs.run")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "phase", "step"),
                                                        name="one_router_load_per_step")],
            },
        ),
    ]
