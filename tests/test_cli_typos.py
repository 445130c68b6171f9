"""A mistyped option is refused by the command it was given to: one line naming that command's
help, and the option meant when one is close (``did you mean --entrypoint?``). A mistyped command,
export kind or option value gets the same (``stepfork repaly``: ``did you mean replay?``)."""

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
        (  # a mistyped command (issue 27)
            ["repaly", "run.sftrace", "--entrypoint", "a:b"],
            "stepfork: error: argument COMMAND: invalid choice: 'repaly'; did you mean replay? "
            "(see stepfork --help)",
        ),
        (
            ["vaildate", "run.sftrace"],
            "stepfork: error: argument COMMAND: invalid choice: 'vaildate'; did you mean "
            "validate? (see stepfork --help)",
        ),
        (
            ["redaction-rule"],
            "stepfork: error: argument COMMAND: invalid choice: 'redaction-rule'; did you mean "
            "redaction-rules? (see stepfork --help)",
        ),
        (  # a mistyped export kind
            ["export", "pytset", "run.sftrace", "--entrypoint", "a:b"],
            "stepfork export: error: argument KIND: invalid choice: 'pytset'; did you mean "
            "pytest? (see stepfork export --help)",
        ),
        (  # a mistyped option value
            ["replay", "run.sftrace", "--entrypoint", "a:b", "--captured", "lenent"],
            "stepfork replay: error: argument --captured: invalid choice: 'lenent'; did you mean "
            "lenient? (see stepfork replay --help)",
        ),
        (  # nothing close: the choices
            ["frobnicate"],
            "stepfork: error: argument COMMAND: invalid choice: 'frobnicate' (choose from "
            "'replay', 'validate', 'export', 'show', 'diff', 'import', 'redaction-rules', "
            "'redact') (see stepfork --help)",
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
