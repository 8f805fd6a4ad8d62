"""`python -m server.runtime.settings --markdown > docs/configuration.md`."""

from __future__ import annotations

import sys

from server.runtime.settings.markdown import markdown


def _main(argv: list[str]) -> None:
    """`python -m server.runtime.settings --markdown`: print docs/configuration.md."""
    if argv != ["--markdown"]:
        sys.exit("usage: python -m server.runtime.settings --markdown > docs/configuration.md")
    # The flags are declared once, by the command's parser; imported here only, as the
    # settings themselves need no command line.
    from server.runtime.cli import setting_flags

    print(markdown(setting_flags()), end="")


_main(sys.argv[1:])
