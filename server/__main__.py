"""`python -m server`: the `memoria` command (server/runtime/cli.py)."""

from server.runtime.cli import main

if __name__ == "__main__":
    main()
