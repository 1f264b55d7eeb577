"""The per-deployment worker loops: observe -> decide -> persist -> actuate, on an injected clock."""
