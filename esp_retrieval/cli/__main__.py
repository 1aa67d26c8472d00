"""``python -m esp_retrieval.cli``: the same dispatcher as the ``esp`` console script."""

from esp_retrieval.cli.main import main

raise SystemExit(main())
