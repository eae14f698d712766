import django.db.models.deletion
from django.db import migrations, models

PHASE_KIND_AND_HELD_OUT = (
    "rewards_chosen", "rewards_rejected", "rewards_accuracy", "rewards_margin", "kl", "reward_mean", "reward_std",
    "completion_length", "zero_spread_groups", "eval_loss", "eval_perplexity", "eval_rewards_chosen",
    "eval_rewards_rejected", "eval_rewards_accuracy", "eval_rewards_margin", "eval_reward_mean", "eval_reward_std",
    "eval_s",
)


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_checkpoint_sealing")]

    operations = [
        *(migrations.AddField(model_name="metricpoint", name=name, field=models.FloatField(null=True))
          for name in PHASE_KIND_AND_HELD_OUT),
        migrations.AddField(
            model_name="phase", name="eval_dataset",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to="runs.dataset",
                                    help_text="the held-out data the box validates this phase on (its recipe's "
                                              "eval_data), if any")),
    ]
