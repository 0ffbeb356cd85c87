"""`python -m laned` is the CLI."""

from laned.cli import main

raise SystemExit(main())
