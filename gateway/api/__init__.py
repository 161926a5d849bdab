"""Thin HTTP routes: parse, call a service, pick JSON or SSE."""
