"""The ``compress`` command: thin adapters that parse, call one library function, print, and exit.

Exit codes: 0 success; 1 a gate failed; 2 bad input (one line naming the problem and the fix).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

from compress.errors import CompressError, GateFailure


class Group(click.Group):
    """Maps compress errors to one line on stderr and an exit code, instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GateFailure as exc:
            for line in exc.lines:
                click.echo(f"gate failed: {line}", err=True)
            sys.exit(1)
        except CompressError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo(
                "interrupted: finished stages are kept; run the same command again to resume", err=True
            )
            sys.exit(130)


_NOISY = ("httpx", "urllib3", "filelock", "absl", "torch", "torchao", "onnxscript", "neural_compressor")


@click.group(cls=Group)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="More detail on stderr, and other libraries' warnings and logs there instead of the run's run.log.",
)
@click.version_option(package_name="compress")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Distil, share, quantize and export a fine-tuned text classifier; check every artifact."""
    from compress.terminal import FORMAT, TERMINAL

    ctx.obj = {"verbose": verbose}
    handler = logging.StreamHandler(TERMINAL)
    handler.setFormatter(logging.Formatter(FORMAT))
    ours = logging.getLogger("compress")
    ours.handlers[:] = [handler]
    ours.setLevel(logging.DEBUG if verbose else logging.INFO)
    ours.propagate = False
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.ERROR)


_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a recipe field, e.g. --set stages.1.epochs=2 (repeatable).",
)


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@_set_option
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Folder that holds run folders.",
)
@click.option("--fresh", is_flag=True, help="Ignore finished stages and run everything again.")
@click.pass_obj
def run(obj: dict | None, recipe: Path, overrides: tuple[str, ...], out: Path, fresh: bool) -> None:
    """Run RECIPE end to end into OUT/<name>/, reusing finished stages.

    Other libraries' warnings and logs go to OUT/<name>/run.log (to the terminal with -v).
    """
    from compress.pipeline import run_recipe
    from compress.recipe import load_recipe
    from compress.summary import summary_table

    loaded = load_recipe(recipe, overrides)
    result = run_recipe(loaded, out, fresh=fresh, quiet=not (obj or {}).get("verbose"), overrides=overrides)
    click.echo(summary_table(result))
    failed = [gate for gate in (result.report or {}).get("gates", []) if gate["verdict"] == "fail"]
    if failed:
        from compress.gate import Verdict

        raise GateFailure([Verdict(**gate).line() for gate in failed])


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@_set_option
def validate(recipe: Path, overrides: tuple[str, ...]) -> None:
    """Check RECIPE without running it: its keys and values, its teacher's config and its local data."""
    from compress.data import check_local_splits
    from compress.recipe import load_recipe

    loaded = load_recipe(recipe, overrides)
    rows = check_local_splits(loaded)
    stages = " -> ".join(stage.type for stage in loaded.stages)
    data = ", ".join(f"{name} {count}" for name, count in rows.items()) or "hub only, not read"
    targets = ", ".join(loaded.targets) or "none"
    click.echo(f"{recipe}: ok ({loaded.name}: {stages}; targets: {targets}; rows: {data})")


@main.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editor completion)."""
    from compress.recipe import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@main.command()
def targets() -> None:
    """List the target profiles: the stock ones (compress/profiles/) or those in $COMPRESS_TARGETS."""
    from compress.targets import available_targets, load_target

    for name in available_targets():
        profile = load_target(name)
        lengths = ",".join(str(n) for n in profile.sequence_lengths)
        click.echo(
            f"{name:18} {profile.format:6} {profile.arch:8} threads={profile.threads} "
            f"seq={lengths} schemes={','.join(profile.quantization.schemes)}  {profile.description}"
        )


def _add_commands() -> None:
    from compress.cli_deploy import COMMANDS as DEPLOY_COMMANDS
    from compress.cli_report import COMMANDS as REPORT_COMMANDS

    for command in (*REPORT_COMMANDS, *DEPLOY_COMMANDS):
        main.add_command(command)


_add_commands()

if __name__ == "__main__":
    main()
