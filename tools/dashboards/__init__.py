"""The Grafana dashboards as code: `python -m tools.dashboards` writes
`grafana/dashboards/*.json` (`build.py`); nothing here runs in the gateway."""
