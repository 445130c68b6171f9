"""A mistyped option is refused by the command it was given to: one line naming that command's
help, and the option meant when one is close (``did you mean --entrypoint?``)."""

from __future__ import annotations

import pytest

from stepfork_otel.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["replay", "run.sftrace", "--entrypoint", "a:b", "--live-lm=openai/m"],
            "stepfork replay: error: unrecognized arguments: --live-lm=openai/m; "
            "did you mean --live-llm? (see stepfork replay --help)",
        ),
        (
            ["validate", "run.sftrace", "--verify-integrty"],
            "stepfork validate: error: unrecognized arguments: --verify-integrty; "
            "did you mean --verify-integrity? (see stepfork validate --help)",
        ),
        (
            ["export", "pytest", "run.sftrace", "--entrypoint", "a:b", "--outptu", "t.py"],
            "stepfork export pytest: error: unrecognized arguments: --outptu t.py; "
            "did you mean --output? (see stepfork export pytest --help)",
        ),
        (
            ["show", "run.sftrace", "--vebrose"],
            "stepfork show: error: unrecognized arguments: --vebrose; "
            "did you mean --verbose? (see stepfork show --help)",
        ),
        (  # nothing close: no guess
            ["diff", "a.sftrace", "b.sftrace", "--bogus"],
            "stepfork diff: error: unrecognized arguments: --bogus (see stepfork diff --help)",
        ),
        (  # an extra positional: the command's help too
            ["show", "a.sftrace", "b.sftrace"],
            "stepfork show: error: unrecognized arguments: b.sftrace (see stepfork show --help)",
        ),
    ],
)
def test_a_typo_is_refused_by_its_command(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == line + "\n"
