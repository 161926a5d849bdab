"""Benchmarks: the mixed-traffic replay (`python -m bench run`) and standalone figure scripts."""
