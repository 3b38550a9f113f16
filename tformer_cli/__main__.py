"""``python -m tformer_cli``."""

from tformer_cli.cli import main

main()
