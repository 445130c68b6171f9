"""An unusable ``STEPFORK_DIRECTORY`` under ``opentelemetry-instrument`` is one warning line at
start-up (and no bundle processor), not an internal-error traceback at every bundle."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel.otel import zero_code


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(zero_code, "configure", lambda **kwargs: calls.append(kwargs))
    return calls


def test_a_path_under_a_file_is_one_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    configured: list[Any],
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STEPFORK_DIRECTORY", str(blocker / "traces"))
    with caplog.at_level(logging.DEBUG, logger="stepfork_otel"):
        zero_code.post_instrument()
    assert configured == []
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    message = record.getMessage()
    assert f"STEPFORK_DIRECTORY={blocker / 'traces'} cannot be written" in message
    assert f"{blocker} is not a directory" in message
    assert "\n" not in message


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes everywhere"
)
def test_a_read_only_directory_is_one_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    configured: list[Any],
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        monkeypatch.setenv("STEPFORK_DIRECTORY", str(locked / "traces"))
        zero_code.post_instrument()
    finally:
        locked.chmod(0o700)
    assert configured == []
    assert f"{locked} is not writable" in caplog.text


@pytest.mark.parametrize("name", ["traces", "new/nested/traces", "."])
def test_a_usable_directory_is_configured_and_not_created(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    configured: list[Any],
    name: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STEPFORK_DIRECTORY", name)
    zero_code.post_instrument()
    assert configured == [{"directory": name}]
    assert list(tmp_path.iterdir()) == []  # created when the first bundle is written
    assert caplog.records == []
