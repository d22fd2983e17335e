"""``featurestream --help`` and each command's ``--help`` are plain text: no reStructuredText markup for the user."""

from __future__ import annotations

import re

import pytest

from featurestream import cli

MARKUP = re.compile(r"``|:(?:func|class|meth|mod|attr):`")


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in cli.COMMANDS)])
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert "usage: featurestream" in shown
    assert not MARKUP.search(shown), shown
