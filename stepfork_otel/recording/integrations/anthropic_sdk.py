"""``instrument_anthropic()``: every request of the ``anthropic`` SDK as a boundary call."""

from __future__ import annotations

from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.recording.integrations import genai, sdk


def _operation(method: str, url: str) -> str:
    path = url.removeprefix("v1/")
    if path == "messages":
        return k.OP_CHAT
    if path == "complete":
        return k.OP_TEXT_COMPLETION
    return f"{method} {url}"


def _describe(
    input_text: str, output_text: str, usage_elsewhere: bool, output: Any
) -> dict[str, Any]:
    return genai.describe(
        input_text, output_text, usage_elsewhere, genai.anthropic_response, output
    )


ANTHROPIC = sdk.Provider(k.PROVIDER_ANTHROPIC, "anthropic", _operation, _describe)


def instrument_anthropic(client: Any = None) -> None:
    """Record (and replay) every request of the Anthropic SDK: ``Anthropic``, ``AsyncAnthropic``
    (and the Bedrock/Vertex clients built on them), created before or after this call -- or
    only ``client``'s. Idempotent. ``messages.create`` (also ``stream=True``) and
    ``messages.stream(...)`` are ``chat {model}`` boundary spans; see :func:`instrument_openai`
    for what is recorded. Needs ``pip install 'stepfork-otel[anthropic]'``.
    """
    sdk.instrument(ANTHROPIC, client)


def uninstrument_anthropic(client: Any = None) -> None:
    """Undo :func:`instrument_anthropic` (for the SDK, or for ``client``)."""
    sdk.uninstrument(ANTHROPIC, client)
