"""`python -m laned` is the CLI."""

from laned.cli.main import main

raise SystemExit(main())
