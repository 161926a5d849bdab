"""The CPU tier's engine unit tests, collected again against vLLM 0.33.0: the depth-capping
schedulers (sync and async, placeholder drafts cut per request, the step depth, the cap,
the constant batch-size schedule), the batch-depth rule, the vLLM hook check, model
sources and the one-line start errors."""

from tests.engine.test_batch_depth import *  # noqa: F403
from tests.engine.test_compat import *  # noqa: F403
from tests.engine.test_engine_args_defaults import *  # noqa: F403
from tests.engine.test_model_source import *  # noqa: F403
from tests.engine.test_parsers import *  # noqa: F403
from tests.engine.test_plan import *  # noqa: F403
from tests.engine.test_preflight import *  # noqa: F403
from tests.engine.test_scheduler import *  # noqa: F403
from tests.engine.test_scheduler_prefix import *  # noqa: F403
