"""schemathesis hooks of test_v1_schema.py. A schema-valid request whose prompt does not fit
the model's context (the `tiny` model's is 1,024 tokens) is refused with 400
`context_length_exceeded`, as OpenAI's API refuses it: a limit in tokens of a model, which the
document cannot state; so are a `tool_choice` naming a tool that `tools` lacks and two tools
of one name (rules across fields and items). Those rejections alone are not failures; any
other 400 to a schema-valid request still is."""

import json

import schemathesis


@schemathesis.hook
def filter_failure(ctx, failure, case, response) -> bool:
    if failure.code != "ST202" or response.status_code != 400:
        return True
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return True
    # OpenAI's body names the code; Anthropic's (/v1/messages) only says it. A tool_choice
    # naming a tool that is not among `tools` is the other rule the document cannot state.
    message = str(error.get("message"))
    return (
        error.get("code") != "context_length_exceeded"
        and not message.startswith("This model's maximum context length")
        and not message.endswith("which is not one of the tools.")
        and message != "Function names must be unique."
    )
