"""Developer tools outside the runtime packages: the embedded model's builder (`tools.model`)
and the Grafana dashboards as code (`tools.dashboards`)."""
