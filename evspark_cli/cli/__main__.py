"""`python -m evspark_cli.cli`: the same as the `evspark` command."""
from . import main

main()
