"""Optional wrappers for LLM client libraries (none required)."""
