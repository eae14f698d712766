"""What a model's database column can hold, read from the model field and the database's integer ranges: the limits
a provider's value is checked against (fleet.providers.fields.column_problem) before it is written, so one value
that does not fit is skipped with its reason instead of failing a whole save."""

from django.db import connection, models

from fleet.providers.fields import Column


def column_of(model_field: models.Field) -> Column:
    null = model_field.null
    if isinstance(model_field, models.BooleanField):
        return Column("flag", null=null)
    if isinstance(model_field, models.DecimalField):
        return Column("decimal", null=null, max_digits=model_field.max_digits,
                      decimal_places=model_field.decimal_places)
    if isinstance(model_field, models.IntegerField):
        low, high = connection.ops.integer_field_range(model_field.get_internal_type())
        return Column("whole", null=null, low=low, high=high)
    if isinstance(model_field, models.FloatField):
        return Column("real", null=null)
    if isinstance(model_field, models.CharField):
        return Column("text", null=null, max_length=model_field.max_length)
    raise TypeError(f"{model_field.model.__name__}.{model_field.name}: no check for a {type(model_field).__name__}")
