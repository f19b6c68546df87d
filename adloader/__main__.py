"""``python -m adloader`` is the same as the ``adloader`` console script."""
from adloader.cli import main

raise SystemExit(main())
