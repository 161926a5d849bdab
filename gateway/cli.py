"""`spec-gateway`: serve, hash keys, build/measure the embedded model, admin commands.

Options resolve as: flags > environment (`SPECGW_*`, `SPECGW_ENGINE_*`) > the
YAML file given with `--config` > defaults. Every option's help text is the
docstring of its settings field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape as rich_escape

from gateway.auth import digest

app = typer.Typer(
    help="spec-gateway: an OpenAI-compatible gateway that sets the speculative-decoding "
    "depth per request class from live acceptance.",
    no_args_is_help=True,
    add_completion=False,
)
keys_app = typer.Typer(help="API key helpers.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def _settings_epilog() -> str:
    """Every setting, with its default and description, for `serve --help`.

    The flags above cover the common ones; the rest come from the environment or
    the YAML file. Read from the settings models' fields, not from the environment.
    """
    from engine.settings import EngineSettings
    from gateway.control.settings import ControllerSettings
    from gateway.flags.settings import FlagSettings
    from gateway.settings import GatewaySettings
    from gateway.state.settings import ClassStateSettings

    lines = [
        "All settings, by environment variable. The gateway's (SPECGW_*) and the engine's "
        "(SPECGW_ENGINE_*, under `engine:`) are also read from --config, keyed by field name."
    ]
    seen: set[str] = set()
    models = (GatewaySettings, EngineSettings, ControllerSettings, ClassStateSettings, FlagSettings)
    for model in models:
        prefix = str(model.model_config.get("env_prefix", ""))
        for name, info in model.model_fields.items():
            env = f"{prefix}{name}".upper()
            if env not in seen:
                seen.add(env)
                default = info.get_default(call_default_factory=True)
                lines.append(f"{env} (default {default!r}): {info.description}")
    return rich_escape("\n\n".join(lines))


@app.command(epilog=_settings_epilog())
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind.")] = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML config file (gateway keys; `engine:` section).")
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
) -> None:
    """Start the gateway with its embedded vLLM engine (or the backend `--backend` names)."""

    from engine.settings import EngineSettings
    from gateway.app import create_app
    from gateway.backends import runtime_factory
    from gateway.control.settings import ControllerSettings
    from gateway.observability.logs import configure_logging
    from gateway.server import DrainingServer, server_config
    from gateway.settings import GatewaySettings

    settings = GatewaySettings.load(config, host=host, port=port, log_level=log_level)
    controller_settings = (
        ControllerSettings(default_k=default_k) if default_k is not None else ControllerSettings()
    )
    engine_settings = EngineSettings.load(
        config, model=model, drafter=drafter, max_depth=max_depth, backend=backend
    )
    configure_logging(settings.log_level)
    if engine_settings.backend == "vllm":
        _preflight_or_exit(engine_settings)
    try:
        application = create_app(settings, runtime_factory(engine_settings, controller_settings))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    server = DrainingServer(server_config(application, settings), application)
    server.run()
    if server.fatal:
        raise SystemExit(3)


def _preflight_or_exit(engine_settings: Any) -> None:
    """A wrong vLLM, a missing model, a drafter that does not fit: one line, exit 2."""
    from engine.preflight import PREFLIGHT_ERRORS, preflight

    try:
        preflight(engine_settings)
    except PREFLIGHT_ERRORS as exc:
        typer.echo(f"spec-gateway: {exc}", err=True)
        raise SystemExit(2) from None


@keys_app.command("hash")
def hash_key(key: Annotated[str, typer.Argument(help="The plaintext API key.")]) -> None:
    """Print the SHA-256 digest to put in SPECGW_API_KEYS / SPECGW_ADMIN_KEYS."""
    typer.echo(digest(key))


def _mount_optional() -> None:
    """Sub-commands whose modules pull heavy dependencies are mounted when present."""
    try:
        from engine.model.cli import app as model_app
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
