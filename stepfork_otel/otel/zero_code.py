"""The zero-code path: ``opentelemetry-instrument python agent.py`` writes bundles, no code change.

``opentelemetry-instrument`` (package ``opentelemetry-instrumentation``, with
``opentelemetry-distro`` for the SDK configurator) configures the SDK from the ``OTEL_*``
variables, then loads the instrumentors, then calls every ``opentelemetry_post_instrument`` entry
point. stepfork registers :func:`post_instrument` there: when ``STEPFORK_DIRECTORY`` is set it
calls :func:`~stepfork_otel.otel.setup.configure` with that directory, which adds the bundle
processor to the provider the configurator just installed, beside the exporters the ``OTEL_*``
variables chose. Without the variable it does nothing, so installing stepfork changes nothing for
other programs run under ``opentelemetry-instrument``.

Why a post-instrument hook and not the alternatives: an ``opentelemetry_configurator`` of our own
would compete with the distro's (only one is loaded, picked by ``OTEL_PYTHON_CONFIGURATOR``), so
the user would have to name ours and lose theirs; an ``opentelemetry_instrumentor`` needs
``BaseInstrumentor`` and its dependency checks for something that instruments no library. The
post-instrument hook runs after the provider exists, needs nothing but a callable, and keeps the
user's configurator whatever it is.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.otel.setup import configure

logger = logging.getLogger("stepfork_otel")


def unwritable(directory: Path) -> str | None:
    """Why bundles cannot be written under ``directory`` (None: they can, as far as can be told
    without creating it): its nearest existing ancestor is not a directory, or not writable."""
    existing = directory.absolute()
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


@handle_internal_errors("attaching stepfork under opentelemetry-instrument")
def post_instrument() -> None:
    """Entry point (``opentelemetry_post_instrument``): attach the bundle processor when
    ``STEPFORK_DIRECTORY`` names a directory. Never raises into the program being started."""
    directory = os.environ.get(k.ENV_BUNDLE_DIRECTORY, "").strip()
    if not directory:
        return
    problem = unwritable(Path(directory))
    if problem is not None:  # one line now, not an internal-error traceback at every bundle
        logger.warning(
            "stepfork_otel: %s=%s cannot be written (%s); no bundles are written, the program "
            "runs and its spans are exported as usual",
            k.ENV_BUNDLE_DIRECTORY,
            directory,
            problem,
        )
        return
    configure(directory=directory)
    logger.debug("stepfork_otel: writing bundles to %s (%s)", directory, k.ENV_BUNDLE_DIRECTORY)
