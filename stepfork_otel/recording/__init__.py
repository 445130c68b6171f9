"""Boundaries (``trace_tool``, ``llm_request``), the recording context and recording settings."""
