"""The engine twin: a virtual-time speculative vLLM engine that drives the real controller."""
