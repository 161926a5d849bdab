"""vLLM's OpenAI protocol models, re-exported for the gateway's routes and the fake backend.

The gateway validates bodies with exactly the models `vllm serve` uses (so
every field a vLLM client sends is understood the same way), without importing
vLLM itself: only this module and `engine.vllm` do (pyproject's import contracts).
`engine.fake_frontend` builds its replies and stream chunks from the same models, so
the fake's wire format is vLLM's. Besides the models, the Responses API's wire reading
is vLLM's too: how a request's input reads as chat messages and tools
(`construct_input_messages`, `construct_tool_dicts`, used by `engine.responses_wire`)
and the event sequence of a streamed answer (`SimpleStreamingEventProcessor`, used by
the fake backend).
"""

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    PerRequestMetrics,
    SpeculativeDecodingMetrics,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.openai.responses.protocol import (
    InputTokensDetails,
    OutputTokensDetails,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseInProgressEvent,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from vllm.entrypoints.openai.responses.streaming_events import SimpleStreamingEventProcessor
from vllm.entrypoints.openai.responses.utils import (
    construct_input_messages,
    construct_tool_dicts,
)
from vllm.entrypoints.serve.engine.protocol import (
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokenUsageInfo,
    UsageInfo,
)
from vllm.exceptions import VLLMClientError as ClientError

__all__ = [
    "ChatCompletionNamedToolChoiceParam",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatCompletionResponseChoice",
    "ChatCompletionResponseStreamChoice",
    "ChatCompletionStreamResponse",
    "ChatMessage",
    "ClientError",
    "CompletionRequest",
    "CompletionResponse",
    "CompletionResponseChoice",
    "CompletionResponseStreamChoice",
    "CompletionStreamResponse",
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ErrorInfo",
    "ErrorResponse",
    "FunctionCall",
    "InputTokensDetails",
    "ModelCard",
    "ModelList",
    "OutputTokensDetails",
    "PerRequestMetrics",
    "PromptTokenUsageInfo",
    "ResponseCompletedEvent",
    "ResponseCreatedEvent",
    "ResponseInProgressEvent",
    "ResponseUsage",
    "ResponsesRequest",
    "ResponsesResponse",
    "SimpleStreamingEventProcessor",
    "SpeculativeDecodingMetrics",
    "ToolCall",
    "UsageInfo",
    "construct_input_messages",
    "construct_tool_dicts",
]
