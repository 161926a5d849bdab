"""Build the default model from scratch: tokenizer, target, both drafters, manifest.

Deterministic (fixed seeds, sorted and hashed data), with progress bars. The
build writes into a temporary sibling directory and renames it into place only
when everything is written, so an interrupted or failed build never leaves a
half-written model where the server would load it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm import tqdm

from engine.model_paths import ModelPaths
from tools.model.corpus import corpus_hash, load_corpus
from tools.model.drafter import DrafterShape, Eagle3Drafter, save_drafter
from tools.model.families import DRAFTER_FAMILIES, TARGET_FAMILIES, training_texts
from tools.model.target import TargetShape, TrainBudget, make_target, pack, train_target
from tools.model.tokenizer import padded_vocab, save_tokenizer, train_tokenizer
from tools.model.train_drafter import DrafterBudget, DrafterStats, init_drafter, train_drafters

BudgetName = Literal["full", "tiny"]


class BuildError(RuntimeError):
    """The build cannot run with these inputs (bad output directory, no corpus)."""


@dataclass(frozen=True, slots=True)
class BuildPlan:
    shape: TargetShape
    target: TrainBudget
    drafter: DrafterBudget
    vocab: int = 2048
    max_docs: int | None = None
    data_seed: int = 0
    model_seed: int = 0
    threads: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def plan_for(budget: BudgetName) -> BuildPlan:
    if budget == "full":
        return BuildPlan(
            shape=TargetShape(layers=16, hidden=128, heads=2, kv_heads=1, intermediate=384),
            target=TrainBudget(steps=1400, max_seconds=1400, batch=8, seq_len=256, lr=3e-3),
            drafter=DrafterBudget(steps=500, max_seconds=540, batch=8, seq_len=256),
        )
    return BuildPlan(
        shape=TargetShape(layers=4, hidden=128, heads=2, kv_heads=1, intermediate=256),
        target=TrainBudget(steps=6, max_seconds=30, batch=2, seq_len=128, warmup=2),
        drafter=DrafterBudget(steps=3, max_seconds=20, batch=2, seq_len=128, warmup=1),
        vocab=512,
        max_docs=60,
    )


def aux_layers(layers: int) -> tuple[int, int, int]:
    """Three distinct target layers (HF `output_hidden_states` indices)."""
    if layers >= 6:
        return (2, layers // 2, layers - 3)
    if layers < 3:
        raise BuildError("the target needs at least 3 layers for EAGLE-3")
    return (1, layers // 2, layers - 1)


def check_out(out: Path) -> None:
    parent = out.resolve().parent
    if not parent.is_dir():
        raise BuildError(f"output parent directory {parent} does not exist")
    if out.exists() and not out.is_dir():
        raise BuildError(f"output path {out} exists and is not a directory")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise BuildError(f"cannot write into {parent}: {exc}") from exc


def build(
    out: Path,
    budget: BudgetName = "full",
    stdlib: Path | None = None,
    reuse_target: Path | None = None,
) -> dict[str, Any]:
    """Build everything into `out` (replaced atomically); returns the manifest.

    `reuse_target` skips the tokenizer and target stages (the longest part of a
    build) and trains fresh drafters on an already built target: the way to
    retrain drafters alone, or to finish a build that was stopped after its
    target was written.
    """
    if reuse_target is not None and not (reuse_target / "config.json").is_file():
        raise BuildError(f"{reuse_target} holds no built target (no config.json)")
    check_out(out)
    plan = plan_for(budget)
    torch.set_num_threads(plan.threads)
    docs = load_corpus(stdlib)
    if plan.max_docs:
        docs = docs[: plan.max_docs]
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.resolve().parent))
    tmp.chmod(0o755)
    try:
        manifest = _build_into(ModelPaths(tmp), plan, docs, budget, reuse_target)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _swap_in(tmp: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _build_into(
    paths: ModelPaths, plan: BuildPlan, docs: list[Any], budget: str, reuse: Path | None
) -> dict[str, Any]:
    started = time.time()
    texts = training_texts(docs, TARGET_FAMILIES, plan.data_seed)
    if reuse is None:
        tok = train_tokenizer([t.text for t in texts], plan.vocab)
        save_tokenizer(tok, paths.target)
    else:
        tok = _copy_target(reuse, paths.target)
    vocab, eos, pad = padded_vocab(tok), tok.convert_tokens_to_ids(tok.eos_token), tok.pad_token_id
    target_docs = [tok(t.text)["input_ids"] for t in texts]
    target_data = pack(target_docs, plan.target.seq_len)
    target_result: dict[str, Any]
    if reuse is None:
        model = make_target(plan.shape, vocab, eos, pad, plan.model_seed)
        with tqdm(total=plan.target.steps, desc="target", unit="step") as bar:
            target_result = train_target(
                model, target_data, plan.target, lambda s, loss: _tick(bar, s, loss=f"{loss:.3f}")
            )
        _save_target(model, paths.target, eos)
    else:
        model = _load_target(paths.target)
        target_result = {"reused_from": str(reuse.resolve())}
    drafter_texts = [t for t in texts if t.family in DRAFTER_FAMILIES]
    drafter_data = pack([tok(t.text)["input_ids"] for t in drafter_texts], plan.drafter.seq_len)
    drafters = _make_drafters(plan, vocab, model)
    with tqdm(total=plan.drafter.steps, desc="drafters", unit="step") as bar:
        drafter_result = train_drafters(
            model, drafters, drafter_data, plan.drafter, lambda s, st: _tick(bar, s, **_fmt(st))
        )
    for name, drafter in drafters.items():
        save_drafter(drafter, paths.root / name, plan.shape.max_positions)
    manifest = _manifest(plan, budget, docs, texts, target_data, drafter_data, started)
    manifest["target"]["result"] = target_result
    manifest["drafters"] = {
        n: {"result": r, "shape": asdict(drafters[n].shape)} for n, r in drafter_result.items()
    }
    manifest["sizes_bytes"] = {
        p.name: _size(p) for p in (paths.target, paths.eagle31, paths.eagle3)
    }
    paths.manifest.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest


def _tick(bar: Any, step: int, **post: str) -> None:
    bar.update(step - bar.n)
    bar.set_postfix(post, refresh=False)


def _fmt(stats: dict[str, DrafterStats]) -> dict[str, str]:
    return {n: f"loss={s.loss:.3f} len~{s.expected_length():.2f}" for n, s in stats.items()}


def _make_drafters(plan: BuildPlan, vocab: int, target: Any) -> dict[str, Eagle3Drafter]:
    out: dict[str, Eagle3Drafter] = {}
    for name, flag in (("eagle3.1", True), ("eagle3", False)):
        torch.manual_seed(plan.model_seed + 7)
        shape = DrafterShape(
            hidden=plan.shape.hidden, heads=plan.shape.heads, kv_heads=plan.shape.kv_heads,
            head_dim=plan.shape.head_dim, intermediate=plan.shape.intermediate, vocab=vocab,
            aux_layers=aux_layers(plan.shape.layers), fc_norm=flag, norm_output=flag,
        )  # fmt: skip
        drafter = Eagle3Drafter(shape)
        init_drafter(drafter, target)
        out[name] = drafter
    return out


def _save_target(model: Any, out: Path, eos: int) -> None:
    from transformers import GenerationConfig

    model.to(torch.bfloat16).save_pretrained(str(out))
    model.to(torch.float32)
    GenerationConfig(eos_token_id=eos).save_pretrained(str(out))  # type: ignore[no-untyped-call]


def _copy_target(src: Path, dst: Path) -> Any:
    from transformers import AutoTokenizer

    shutil.copytree(src, dst, dirs_exist_ok=True)
    return AutoTokenizer.from_pretrained(str(dst))


def _load_target(path: Path) -> Any:
    """The saved (bf16) target in fp32 for drafter training (loaded in eval mode, frozen)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _hash_tensor(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def _manifest(
    plan: BuildPlan, budget: str, docs: list[Any], texts: list[Any],
    target_data: torch.Tensor, drafter_data: torch.Tensor, started: float,
) -> dict[str, Any]:  # fmt: skip
    import tokenizers
    import transformers

    return {
        "budget": budget,
        "built_at_unix": int(started),
        "build_seconds": round(time.time() - started, 1),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "data": {
            "corpus_functions": len(docs),
            "corpus_sha256": corpus_hash(docs),
            "training_documents": len(texts),
            "target_tokens": int(target_data.numel()),
            "target_data_sha256": _hash_tensor(target_data),
            "drafter_tokens": int(drafter_data.numel()),
            "drafter_data_sha256": _hash_tensor(drafter_data),
        },
        "seeds": {
            "data": plan.data_seed,
            "model": plan.model_seed,
            "target_train": plan.target.seed,
            "drafter_train": plan.drafter.seed,
        },
        "tokenizer": {"vocab_trained": plan.vocab},
        "target": {"shape": asdict(plan.shape), "budget": plan.target.as_dict()},
        "drafter_budget": plan.drafter.as_dict(),
    }
