"""Suite-wide fixtures: a real redis-server on loopback (tests/redis_fixtures.py)."""

pytest_plugins = ["tests.redis_fixtures"]
