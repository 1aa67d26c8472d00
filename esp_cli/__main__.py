"""``python -m esp_cli``: the same dispatcher as the ``esp`` console script."""

from esp_cli.main import main

raise SystemExit(main())
