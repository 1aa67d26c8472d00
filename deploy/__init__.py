"""Deployment generators: Grafana dashboards and k8s manifests rendered from the Helm chart.

Each generator builds its files in memory and either writes them (``python -m deploy.X``)
or, with ``--check``, reports drift from what is committed; the tests in ``tests/deploy``
run the same check, so a committed artefact never disagrees with its source.
"""
