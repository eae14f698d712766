from django.contrib import admin

from runs.models import Checkpoint, Run, RunEvent


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "kind", "message"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "restarts", "max_restarts", "budget_usd", "created_at"]
    list_filter = ["state"]
    readonly_fields = ["state", "state_reason", "restarts", "current_instance", "bad_machines"]
    exclude = ["token_nonce"]
    inlines = [RunEventInline]

    def has_add_permission(self, request):
        return False  # runs are launched from the Runs page, which validates the recipe


admin.site.register(Checkpoint)
