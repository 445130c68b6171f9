"""LLM client SDK integrations: every request of an instrumented SDK is a boundary call.

``instrument_openai()`` / ``instrument_anthropic()`` (and their ``uninstrument_*``) are the public
entry points; :mod:`.sdk` says where the SDKs are intercepted and why, :mod:`.exchange` what is
recorded of a request and a response, :mod:`.genai` the semantic-convention attributes. The SDKs
are optional: nothing here imports one until it is instrumented.

The entry points are re-exported lazily (PEP 562): importing this package -- which
``recording/boundaries.py`` does for :mod:`.genai` -- runs none of its modules, so
``sdk.py`` (which imports ``boundaries``) is not imported half-way through ``boundaries``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepfork_otel import _lazy

if TYPE_CHECKING:
    from stepfork_otel.recording.integrations.anthropic_sdk import (
        instrument_anthropic,
        uninstrument_anthropic,
    )
    from stepfork_otel.recording.integrations.openai_sdk import (
        instrument_openai,
        uninstrument_openai,
    )

_EXPORTS: dict[str, str] = {
    "instrument_anthropic": "stepfork_otel.recording.integrations.anthropic_sdk",
    "instrument_openai": "stepfork_otel.recording.integrations.openai_sdk",
    "uninstrument_anthropic": "stepfork_otel.recording.integrations.anthropic_sdk",
    "uninstrument_openai": "stepfork_otel.recording.integrations.openai_sdk",
}


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "instrument_anthropic",
    "instrument_openai",
    "uninstrument_anthropic",
    "uninstrument_openai",
]
