from django.urls import path

from routing import apis, messages_apis
from routing.batches import apis as batch_apis
from routing.responses import apis as responses_apis

urlpatterns = [
    path("models", apis.models, name="v1-models"),
    path("models/<path:model_id>", apis.model_detail, name="v1-model"),
    path("chat/completions", apis.chat_completions, name="v1-chat-completions"),
    path("completions", apis.completions, name="v1-completions"),
    path("embeddings", apis.embeddings, name="v1-embeddings"),
    path("messages", messages_apis.messages_create, name="v1-messages"),
    path(
        "messages/count_tokens",
        messages_apis.messages_count_tokens,
        name="v1-messages-count-tokens",
    ),
]
urlpatterns += [
    path("responses", responses_apis.responses, name="v1-responses"),
    path("responses/<str:response_id>", responses_apis.response_detail, name="v1-response"),
    path(
        "responses/<str:response_id>/input_items",
        responses_apis.response_input_items,
        name="v1-response-input-items",
    ),
]
urlpatterns += [
    path("files", batch_apis.files, name="v1-files"),
    path("files/<str:file_id>", batch_apis.file_detail, name="v1-file"),
    path("files/<str:file_id>/content", batch_apis.file_content, name="v1-file-content"),
    path("batches", batch_apis.batches, name="v1-batches"),
    path("batches/<str:batch_id>", batch_apis.batch_detail, name="v1-batch"),
    path("batches/<str:batch_id>/cancel", batch_apis.batch_cancel, name="v1-batch-cancel"),
]
