"""``tformer`` and ``python -m tformer_cli``: the command line, started so that a Ctrl-C while
torch and the rest import (a second or two) ends as quietly as one during a command."""

import sys


def main() -> None:
    """Console-script entry point."""
    try:
        from tformer_cli.cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
