"""`python -m tools.dashboards [DIR]`: write every dashboard (default `grafana/dashboards/`)."""

from tools.dashboards.build import main

main()
