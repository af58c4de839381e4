from django.urls import path

from routing import apis

urlpatterns = [
    path("models", apis.models, name="v1-models"),
    path("models/<path:model_id>", apis.model_detail, name="v1-model"),
    path("chat/completions", apis.chat_completions, name="v1-chat-completions"),
    path("completions", apis.completions, name="v1-completions"),
    path("embeddings", apis.embeddings, name="v1-embeddings"),
]
