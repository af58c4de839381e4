from django.contrib import admin

from workers.models import ServedModel


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ["name", "source", "is_enabled", "price_input_per_mtok",
                    "price_output_per_mtok", "price_cached_per_mtok", "created_at"]
    list_filter = ["is_enabled"]
    search_fields = ["name", "source"]
