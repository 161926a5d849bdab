"""The vLLM import sweep (tests/engine/test_vllm_imports.py) against vLLM 0.33.0, and the
import that crashed the GPU path after the model loaded, reported by it here."""

from __future__ import annotations

from pathlib import Path

from tests.engine.test_vllm_imports import *  # noqa: F403
from tests.engine.vllm_imports import unresolved, vllm_imports

#: `OpenAIFrontend.create` as it was: the CLI parser from its 0.32 module.
OLD_FRONTEND = """
class OpenAIFrontend:
    @classmethod
    async def create(cls, engine_client, config):
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
"""


def test_the_cli_parser_import_of_vllm_032_is_reported_under_033(tmp_path: Path) -> None:
    frontend = tmp_path / "engine" / "vllm" / "openai_frontend.py"
    frontend.parent.mkdir(parents=True)
    frontend.write_text(OLD_FRONTEND, encoding="utf-8")
    assert unresolved(vllm_imports(tmp_path, ("engine",))) == [
        "engine/vllm/openai_frontend.py:6: from vllm.entrypoints.launchers.cli_args import "
        "make_arg_parser: ModuleNotFoundError: No module named "
        "'vllm.entrypoints.launchers.cli_args'"
    ]
