"""LLM client SDK integrations: every request of an instrumented SDK is a boundary call.

``instrument_openai()`` / ``instrument_anthropic()`` (and their ``uninstrument_*``) are the public
entry points; :mod:`.sdk` says where the SDKs are intercepted and why, :mod:`.exchange` what is
recorded of a request and a response, :mod:`.genai` the semantic-convention attributes. The SDKs
are optional: nothing here imports one until it is instrumented.
"""

from __future__ import annotations

from stepfork_otel.recording.integrations.anthropic_sdk import (
    instrument_anthropic,
    uninstrument_anthropic,
)
from stepfork_otel.recording.integrations.openai_sdk import instrument_openai, uninstrument_openai

__all__ = [
    "instrument_anthropic",
    "instrument_openai",
    "uninstrument_anthropic",
    "uninstrument_openai",
]
