"""The JSON Schema of a `.sftrace` bundle, generated from the pydantic models.

The models in :mod:`stepfork_otel.trace.models` are the definition of the format; the schema is
derived from them, never written by hand, so the two cannot disagree. ``docs/sftrace.schema.json``
is this module's output, committed so that other tools (editors, validators in other languages)
can use it, and a test fails when it goes stale. Regenerate it with::

    python -m stepfork_otel.trace.schema > docs/sftrace.schema.json

The schema describes the run as one object -- what ``Trace.load`` returns; on disk the same
content is laid out as JSON Lines with each payload on its own line (``docs/bundle-format.md``) --
and what it accepts structurally; what it cannot express (event ids
unique, parents earlier in the list, one outcome per call, fingerprints matching payloads) is
checked by :func:`~stepfork_otel.trace.bundle.validate_structure` and
:func:`~stepfork_otel.trace.bundle.verify_integrity`.
"""

from __future__ import annotations

import json
from typing import Any

from stepfork_otel.constants import FORMAT_NAME, FORMAT_VERSION
from stepfork_otel.trace.models import TRACE_ADAPTER

#: Identifier of the schema of the current format version (a URN: nothing is fetched from it).
SCHEMA_ID = f"urn:stepfork:{FORMAT_NAME}:{FORMAT_VERSION}"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def trace_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a `.sftrace` bundle (an uncompressed one)."""
    generated = TRACE_ADAPTER.json_schema(mode="validation")
    generated.pop("title", None)
    generated.pop("description", None)
    # `type` has a default in the models, but the loader needs it to tell events apart
    events = generated["properties"]["events"]["items"]
    for ref in events["discriminator"]["mapping"].values():
        event = generated["$defs"][ref.rsplit("/", 1)[-1]]
        event["required"] = ["type", *event.get("required", [])]
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": SCHEMA_ID,
        "title": f"stepfork_otel .{FORMAT_NAME} bundle, format version {FORMAT_VERSION}",
        "description": (
            "One recorded run of an AI agent: its input and output, the ordered boundary events "
            "(tool_call, tool_result, llm_request, llm_response, error) and the user's own spans "
            "around them. Payloads are the exact redacted canonical JSON text that their SHA-256 "
            "fingerprints hash. This schema describes the run as one object (what Trace.load "
            "returns); on disk the same content is laid out as JSON Lines, with each payload on "
            "its own line (see docs/bundle-format.md). Generated from the pydantic models of "
            "stepfork_otel."
        ),
        **generated,
    }


def schema_text() -> str:
    """The schema as committed in ``docs/sftrace.schema.json``."""
    return json.dumps(trace_json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
