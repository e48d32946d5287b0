"""``python -m duetime`` runs the command-line interface."""

from duetime.cli import main

main()
