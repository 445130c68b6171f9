"""The OpenTelemetry SDK side: the bundle processor (when) and writer (where), set-up, ``record()``,
the OTLP file exporter."""
