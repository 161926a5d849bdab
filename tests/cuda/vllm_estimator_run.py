"""vLLM 0.33's own acceptance estimator, its Triton kernels run on CPU tensors by Triton's
interpreter: the reference the per-class fit (`engine.vllm.class_estimators`) is held to.

vLLM replaces Triton with a placeholder where no GPU driver is active, so this executes the
source of `vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py` as it ships, with the
real `triton` imported in its place (line for line: the interpreter reads the kernels'
source by line number). `TRITON_INTERPRET=1` must be set before Triton is first imported,
hence a process of its own:

    TRITON_INTERPRET=1 VLLM_TARGET_DEVICE=cpu python -m tests.cuda.vllm_estimator_run RUNS.pt

RUNS.pt (`torch.save`): {"slots": S, "positions": K, "refit_interval": N, "runs": [[(idx,
features, sampled, rejected), ...], ...]} (N: the class's `REFIT_INTERVAL` for these runs,
shorter rounds of the same arithmetic). Per step of a run: the features stored at the
rows' slots, as the drafter's kernel stores them; the predictions of the estimator's
current coefficients (`_predict_kernel`'s sigmoid); then `step` grades them. Prints one
JSON list: per run {"slope", "intercepts", "refits"}.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import types
from typing import Any

_IMPORT = "from vllm.triton_utils import tl, triton\n"
_UNUSED = (
    "from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import (\n"
    "    _compute_max_and_sumexp,\n)\n"
)


def interpreted_module() -> Any:
    """0.33's estimator module with the real Triton (the module docstring)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("needs TRITON_INTERPRET=1 before Triton is imported")
    import vllm.v1.worker.gpu.spec_decode.acceptance_estimator as shipped

    source = inspect.getsource(shipped)
    if _IMPORT not in source or _UNUSED not in source:
        raise RuntimeError("vLLM's estimator module no longer imports as expected")
    # Same line count: the interpreter reads each kernel's lines from the shipped file.
    source = source.replace(_IMPORT, "import triton; import triton.language as tl\n")
    source = source.replace(_UNUSED, "\n" * _UNUSED.count("\n"))  # only the predict kernel's
    module = types.ModuleType("vllm_acceptance_estimator_interpreted")
    exec(compile(source, shipped.__file__, "exec"), module.__dict__)
    return module


def run(module: Any, slots: int, positions: int, steps: list[Any]) -> dict[str, Any]:
    import torch

    estimator = module.OnlineAcceptanceEstimator(slots, positions, torch.device("cpu"))
    for idx, features, sampled, rejected in steps:
        estimator.features[idx] = features
        estimator.predictions[idx] = torch.sigmoid(
            estimator.slope * features + estimator.intercepts
        )
        estimator.step(idx, sampled, rejected)
    return {
        "slope": float(estimator.slope[0]),
        "intercepts": [float(x) for x in estimator.intercepts],
        "refits": estimator._refits,
    }


def main(path: str) -> int:
    import torch

    spec = torch.load(path)
    module = interpreted_module()
    module.OnlineAcceptanceEstimator.REFIT_INTERVAL = int(spec["refit_interval"])
    out = [run(module, spec["slots"], spec["positions"], steps) for steps in spec["runs"]]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
