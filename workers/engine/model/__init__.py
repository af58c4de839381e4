"""The decoder model and its paged attention."""
