"""``instrument_openai()``: every request of the ``openai`` SDK as a boundary call."""

from __future__ import annotations

from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.recording.integrations import genai, sdk

_OPERATIONS = (
    ("chat/completions", k.OP_CHAT),
    ("responses", k.OP_CHAT),
    ("completions", k.OP_TEXT_COMPLETION),
    ("embeddings", k.OP_EMBEDDINGS),
)


def _operation(method: str, url: str) -> str:
    """Azure puts the deployment first (``deployments/{name}/chat/completions``)."""
    if method == "POST":
        for path, operation in _OPERATIONS:
            if url == path or url.endswith("/" + path):
                return operation
    return f"{method} {url}"


def _describe(
    input_text: str, output_text: str, usage_elsewhere: bool, output: Any
) -> dict[str, Any]:
    return genai.describe(input_text, output_text, usage_elsewhere, genai.openai_response, output)


OPENAI = sdk.Provider(k.PROVIDER_OPENAI, "openai", _operation, _describe)


def instrument_openai(client: Any = None) -> None:
    """Record (and replay) every request of the OpenAI SDK: ``OpenAI``, ``AsyncOpenAI`` and the
    Azure clients, created before or after this call -- or only ``client``'s. Idempotent.

    Each request is a ``chat {model}`` (``embeddings``, ``text_completion``, or ``METHOD url``)
    boundary span whose input is the request body as sent and whose output is the response the
    SDK received (an event stream chunk by chunk); replay serves it to the SDK, which rebuilds
    its own objects, streams and exceptions from it. Needs ``pip install 'stepfork-otel[openai]'``.
    """
    sdk.instrument(OPENAI, client)


def uninstrument_openai(client: Any = None) -> None:
    """Undo :func:`instrument_openai` (for the SDK, or for ``client``)."""
    sdk.uninstrument(OPENAI, client)
