from tests.redis_fixtures import delay_proxy, redis_server

__all__ = ["delay_proxy", "redis_server"]
