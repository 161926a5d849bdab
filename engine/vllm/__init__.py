"""The vLLM backend: the embedded engine, its scheduler and worker hooks, vLLM's serving
layer as the serving port, and the checks run before it starts. Only this package (and
`engine.protocol`, the wire models) imports vLLM."""
