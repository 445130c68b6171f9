"""``python -m stepfork_otel.cli``: the same as the ``stepfork`` console script."""

from __future__ import annotations

import sys

from stepfork_otel.cli import main

sys.exit(main())
