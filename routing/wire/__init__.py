"""OpenAI's wire format: request parsing and response rendering."""
