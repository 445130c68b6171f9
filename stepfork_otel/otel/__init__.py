"""OpenTelemetry glue: span <-> event conversion, the bundle processor, set-up, OTLP import."""
