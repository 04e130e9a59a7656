"""`fleetctl`'s entry point: the command line is imported inside it, so that an interrupt
while it loads (a second or so: SQLAlchemy, pydantic, RQ) ends as one later does, with
"error: aborted" and exit 130, not a traceback. It imports nothing itself."""

from __future__ import annotations

import sys

ABORTED_EXIT_CODE = 130


def main() -> None:
    """Load the command line, then run it (`controlplane.cli.main.main`)."""
    try:
        from controlplane.cli.main import main as run
    except KeyboardInterrupt:
        sys.stderr.write("error: aborted\n")
        sys.exit(ABORTED_EXIT_CODE)
    run()


if __name__ == "__main__":
    main()
