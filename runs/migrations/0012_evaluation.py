from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_router_load")]

    operations = [
        migrations.AddField(
            model_name='run',
            name='promoted',
            field=models.BooleanField(blank=True, help_text="the latest evaluation's verdict by the recipe's promote rule; none: never evaluated", null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='state',
            field=models.CharField(choices=[('pending', 'Pending'), ('provisioning', 'Provisioning'), ('installing', 'Installing'), ('training', 'Training'), ('evaluating', 'Evaluating'), ('recovering', 'Recovering'), ('finished', 'Finished'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('eval_failed', 'Eval Failed')], default='pending', max_length=20),
        ),
        migrations.CreateModel(
            name='Evaluation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveSmallIntegerField(help_text="0: the recipe's eval phase; 1, 2, ...: evaluate again")),
                ('phase', models.PositiveSmallIntegerField(help_text="the eval phase's index in the recipe its box receives: after the training phases")),
                ('settings', models.JSONField(help_text='the eval phase as checked: data, scorer, max_new_tokens, max_samples, ...')),
                ('samples_expected', models.PositiveIntegerField(help_text="the eval file's records, or its max_samples cut")),
                ('budget_usd', models.DecimalField(blank=True, decimal_places=2, help_text='evaluate again only: what its own boxes may cost', max_digits=10, null=True)),
                ('state', models.CharField(choices=[('waiting', 'Waiting'), ('running', 'Running'), ('finished', 'Finished'), ('failed', 'Failed')], default='waiting', max_length=10)),
                ('reason', models.TextField(blank=True, help_text="why it failed, or the promote rule's words")),
                ('base_score', models.FloatField(blank=True, null=True)),
                ('adapter_score', models.FloatField(blank=True, null=True)),
                ('difference', models.FloatField(blank=True, null=True)),
                ('ci_low', models.FloatField(blank=True, help_text='95% paired-bootstrap interval of the difference', null=True)),
                ('ci_high', models.FloatField(blank=True, null=True)),
                ('wins', models.PositiveIntegerField(blank=True, null=True)),
                ('ties', models.PositiveIntegerField(blank=True, null=True)),
                ('losses', models.PositiveIntegerField(blank=True, null=True)),
                ('promoted', models.BooleanField(blank=True, null=True)),
                ('generated_with', models.CharField(blank=True, help_text='vllm or transformers', max_length=20)),
                ('tokens_per_s', models.FloatField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('dataset', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='evaluations', to='runs.dataset')),
                ('evaluated_alert', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.alert')),
                ('promoted_alert', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.alert')),
                ('requested_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL)),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='evaluations', to='runs.run')),
            ],
            options={
                'ordering': ['number'],
            },
        ),
        migrations.CreateModel(
            name='EvalSample',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('index', models.PositiveIntegerField()),
                ('prompt', models.TextField()),
                ('expected', models.TextField(blank=True)),
                ('base_answer', models.TextField()),
                ('adapter_answer', models.TextField()),
                ('base_score', models.FloatField()),
                ('adapter_score', models.FloatField()),
                ('recorded_at', models.DateTimeField()),
                ('evaluation', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='samples', to='runs.evaluation')),
            ],
            options={
                'ordering': ['index'],
            },
        ),
        migrations.AddField(
            model_name='runattempt',
            name='evaluation',
            field=models.ForeignKey(blank=True, help_text="the evaluate-again this box was rented for: its cost is that evaluation's, not training's", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='attempts', to='runs.evaluation'),
        ),
        migrations.AddConstraint(
            model_name='evaluation',
            constraint=models.UniqueConstraint(fields=('run', 'number'), name='one_evaluation_per_number'),
        ),
        migrations.AddConstraint(
            model_name='evalsample',
            constraint=models.UniqueConstraint(fields=('evaluation', 'index'), name='one_sample_per_index'),
        ),
    ]
