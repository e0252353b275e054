"""One module a model: its registry entry, ENTRY (nmt.models.registry.ModelEntry), torch-free.
The registry finds them; nothing lists them."""
