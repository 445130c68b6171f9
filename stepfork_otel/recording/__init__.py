"""The one interception point: the boundaries (``trace_tool``, ``llm_request``), the contract
with replay, the payload hand-off, and what is written on spans. OpenTelemetry API only."""
