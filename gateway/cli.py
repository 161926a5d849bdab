"""`spec-gateway`: serve, hash keys, build/measure the embedded model, admin commands.

Settings resolve as: flags > environment (`SPECGW_*`, `SPECGW_<SECTION>_*`) > the YAML
file given with `--config` > defaults (`gateway.config`); an unknown key or a value out
of bounds stops `serve` before anything starts, with one line naming the key. Every
setting's help text is the description of its settings field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gateway.auth import digest

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gateway.config import ServeSettings

app = typer.Typer(
    help="spec-gateway: an OpenAI-compatible gateway that sets the speculative-decoding "
    "depth per request class from live acceptance.",
    no_args_is_help=True,
    add_completion=False,
)
keys_app = typer.Typer(help="API key helpers.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def _version(value: bool) -> None:
    """`--version`: this package's version and the installed vLLM's, read from the
    installed distributions' metadata (vLLM is not imported: that takes seconds)."""
    if not value:
        return
    from importlib import metadata

    from engine.backend import load_backend

    try:
        own = metadata.version("spec-gateway")
    except metadata.PackageNotFoundError:
        own = "unknown (not installed)"
    found = load_backend("vllm").library_version()
    vllm = f"vLLM {found}" if found is not None else "vLLM not installed"
    typer.echo(f"spec-gateway {own}, {vllm}")
    raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_version,
            help="Print the versions of spec-gateway and of the installed vLLM, and exit.",
        ),
    ] = False,
) -> None:
    pass


def _settings_epilog() -> str:
    """The common settings of each section (`gateway.config.help`), read from the settings
    models' fields, not from the environment."""
    from gateway.config.help import settings_help

    return settings_help(every=False)


def _help_all(ctx: typer.Context, value: bool) -> None:
    """`serve --help-all`: the options and every setting, by section, then exit."""
    if not value or ctx.resilient_parsing:
        return
    from gateway.config.help import settings_help

    ctx.command.epilog = settings_help(every=True)
    text = ctx.get_help()  # typer's rich formatter prints the help itself and returns ""
    if text:
        typer.echo(text)
    raise typer.Exit()


#: `serve` option -> the setting flag it is short for.
_SHORT_FLAGS = {
    "host": "--host",
    "port": "--port",
    "config": "--config-file",
    "model": "--engine.model",
    "drafter": "--engine.drafter",
    "max_depth": "--engine.max-depth",
    "default_k": "--control.default-k",
    "log_level": "--log-level",
    "backend": "--engine.backend",
}


@app.command(
    epilog=_settings_epilog(),
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Address to bind.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind.")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML settings file: gateway keys, then engine:, control:, ..."),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="Target: a directory or Hugging Face id (default: the embedded model)."),
    ] = None,
    drafter: Annotated[
        Path | None,
        typer.Option(
            help="EAGLE-3 drafter: a directory or Hugging Face id (EAGLE-3 or speculators"
            " config; default: embedded EAGLE 3.1). Token: HF_TOKEN or the HF_TOKEN_PATH file."
        ),
    ] = None,
    max_depth: Annotated[
        int | None, typer.Option(help="K: largest speculation depth any request can get.")
    ] = None,
    default_k: Annotated[
        int | None, typer.Option(help="k for classes the controller knows nothing of.")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level.")] = None,
    backend: Annotated[
        str | None, typer.Option(help="Engine backend: vllm (default) or fake (no model).")
    ] = None,
    help_all: Annotated[
        bool,
        typer.Option(
            "--help-all",
            is_eager=True,
            expose_value=False,
            callback=_help_all,
            help="Show this message with every setting (by section), and exit.",
        ),
    ] = False,
    check_config: Annotated[
        bool,
        typer.Option(
            "--check-config",
            help="Validate the settings, print them resolved as YAML (secrets redacted) and "
            "exit; no engine, no model, no port.",
        ),
    ] = False,
) -> None:
    """Start the gateway with its embedded vLLM engine (or the backend `--backend` names).

    Any setting has a flag of its own too: `--max-running 8`, `--engine.max-depth 2`.
    Below are the common ones by section; `--help-all` lists every one.
    The options above are short forms of some; given twice, the last one wins.
    """
    short = {"host": host, "port": port, "config": config, "model": model}
    short |= {"drafter": drafter, "max_depth": max_depth, "default_k": default_k}
    short |= {"log_level": log_level, "backend": backend}
    spelt = [part for k, v in short.items() if v is not None for part in (_SHORT_FLAGS[k], str(v))]
    settings = _settings_or_exit([*ctx.args, *spelt])
    if check_config:
        from gateway.config import resolved_yaml

        typer.echo(resolved_yaml(settings), nl=False)
    else:
        _run(settings)


def _run(settings: ServeSettings) -> None:
    """The backend's preflight, the app, the server until it drains; exit 3 when the
    engine could not be kept alive."""
    from gateway.observability.logs import configure_logging
    from gateway.server import DrainingServer, server_config

    configure_logging(settings.log_level)
    _preflight_or_exit(settings.engine)
    try:
        application = build_app(settings)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    server = DrainingServer(server_config(application, settings), application)
    server.run()
    if server.fatal:
        raise SystemExit(3)


def build_app(settings: ServeSettings) -> FastAPI:
    """The app `serve` runs: the backend, engine and controller its settings name."""
    from gateway.app import create_app
    from gateway.runtime import runtime_factory

    return create_app(settings, runtime_factory(settings.engine, settings.control))


def _settings_or_exit(args: list[str]) -> ServeSettings:
    """The resolved settings, or each mistake on one line (`spec-gateway: config: KEY: ...`)
    and exit 2, before anything is imported that takes time or starts. A `SPECGW_*`
    variable nothing reads is named first, on stderr, and ignored (as vLLM does for
    `VLLM_*`)."""
    import os

    from gateway.config import ConfigError, ServeSettings, resolve
    from gateway.config.environment import unknown_variables

    for line in unknown_variables(os.environ, ServeSettings):
        typer.echo(f"spec-gateway: warning: {line}", err=True)
    try:
        return resolve(args)
    except ConfigError as exc:
        for line in exc.lines:
            typer.echo(f"spec-gateway: config: {line}", err=True)
        raise SystemExit(2) from None


def _preflight_or_exit(engine_settings: Any) -> None:
    """What the backend refuses to start (a wrong vLLM, a missing model, a drafter that
    does not fit): one line, exit 2."""
    from engine.backend import PreflightError, load_backend

    try:
        load_backend(engine_settings.backend).preflight(engine_settings)
    except PreflightError as exc:
        typer.echo(f"spec-gateway: {exc}", err=True)
        raise SystemExit(2) from None


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def plan(
    ctx: typer.Context,
    model: Annotated[
        Path | None, typer.Option(help="Target: a directory or Hugging Face id.")
    ] = None,
    drafter: Annotated[
        Path | None, typer.Option(help="EAGLE-3 drafter: a directory or Hugging Face id.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML settings file, as for serve.")] = None,
    gpu_memory_gib: Annotated[
        float, typer.Option(help="Memory of one GPU, for the CUDA column's KV-cache estimate.")
    ] = 80.0,
) -> None:
    """Print what `serve` would run with these settings, here and on CUDA, without
    starting anything: eager or graphs, the FULL-graph widths per batch size and the
    step depths, async scheduling, the model runner, the KV-cache budget, the tool and
    reasoning parsers, the served names. Reads the models' configs and chat template
    (no weights); exits 2, in one line, on what `serve` would refuse or where CUDA
    would silently lose a feature. Takes every setting flag `serve` takes."""
    short = {"model": model, "drafter": drafter, "config": config}
    spelt = [part for k, v in short.items() if v is not None for part in (_SHORT_FLAGS[k], str(v))]
    settings = _settings_or_exit([*ctx.args, *spelt])
    from engine.backend import PreflightError, load_backend

    try:
        running = None if settings.max_running_follows_engine else settings.max_running
        backend = load_backend(settings.engine.backend)
        text = backend.startup_plan(settings.engine, running, gpu_memory_gib)
    except PreflightError as exc:
        typer.echo(f"spec-gateway: {exc}", err=True)
        raise SystemExit(2) from None
    typer.echo(text, nl=False)


@keys_app.command("hash")
def hash_key(key: Annotated[str, typer.Argument(help="The plaintext API key.")]) -> None:
    """Print the SHA-256 digest to put in SPECGW_API_KEYS / SPECGW_ADMIN_KEYS."""
    typer.echo(digest(key))


def _mount_optional() -> None:
    """Sub-commands whose modules pull heavy dependencies are mounted when present."""
    try:
        from tools.model.cli import app as model_app
    except ImportError:
        pass
    else:
        app.add_typer(model_app, name="model", help="Build or measure the embedded model.")
    try:
        from gateway.admin_client import classes_command, flags_app
    except ImportError:
        pass
    else:
        app.add_typer(flags_app, name="flags", help="Get, set or unset ops flags.")
        app.command("classes")(classes_command)


def main() -> None:
    _mount_optional()
    app()


if __name__ == "__main__":
    main()
