"""vLLM's OpenAI protocol models, re-exported for the gateway's routes.

The gateway validates bodies with exactly the models `vllm serve` uses (so
every field a vLLM client sends is understood the same way), without importing
vLLM itself: only `engine/` does.
"""

from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelList
from vllm.exceptions import VLLMClientError as ClientError

__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ClientError",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorResponse",
    "ModelList",
]
