"""pytest integration (opt-in ``pytest11`` entry point ``stepfork``): implemented with issue 4."""
