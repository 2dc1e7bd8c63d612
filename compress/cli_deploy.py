"""``compress bundle``, ``verify-arm`` and ``check-parity``: thin adapters over compress.bundle, compress.arm
and compress.parity.

Paths are checked by the library, not click, so a symlink loop or a FIFO is named as such in one
``error:`` line instead of click's "does not exist".
"""

from __future__ import annotations

from pathlib import Path

import click

from compress.errors import CompressError
from compress.run_layout import MANIFEST_FILE


def _megabytes(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    return f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


@click.command("bundle")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--target", required=True, help="Target profile the bundle is for, e.g. raspberry-pi-4.")
@click.option("-o", "--out", type=click.Path(path_type=Path, dir_okay=False), help="Bundle file (.tar.gz).")
@click.option(
    "--app-kit/--no-app-kit",
    default=None,
    help="Add io-contract.json and tokenizer parity vectors for an app that ports the tokenizer "
    "[default: for phone targets (android-*, ios-*) only].",
)
def bundle_cmd(run: Path, target: str, out: Path | None, app_kit: bool | None) -> None:
    """Pack RUN's artifact for TARGET with the on-device runner into one tar.gz (int8 when there is one)."""
    from compress.bundle import make_bundle

    info = make_bundle(run, target, out, app_kit=app_kit)
    click.echo(
        f"{info['path']}: {_megabytes(info['bytes'])} "
        f"({info['artifact']}, {info['format']} {info['precision']}, for {target})"
    )
    for name, size in info["files"].items():
        click.echo(f"  {name:34} {_megabytes(size):>10}")


def recipe_min_agreement(run_dir: Path) -> float | None:
    """1 - the run's quantize ``tolerable_loss``: the share of labels int8 may change is the share
    that may differ on another instruction set. The value each quantize stage ran with (its manifest's
    ``info.tolerable_loss``; the smallest) comes first, the recipe's (from the run's plan.json) only when
    no stage recorded one. None when there is no quantize stage."""
    from compress.subjects import REDO_RUN, read_run_file, read_stage_manifest, recipe_of_run

    recorded = []
    for stage in read_run_file(run_dir).stages:
        manifest = read_stage_manifest(run_dir / stage.dir) if stage.type == "quantize" else None
        info = (manifest.model_extra or {}).get("info") if manifest is not None else None
        loss = info.get("tolerable_loss") if isinstance(info, dict) else None
        if loss is None:
            continue
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 1:
            raise CompressError(
                f"{run_dir / stage.dir / MANIFEST_FILE}: info.tolerable_loss must be a number from 0 "
                f"to 1 (got {loss!r}); {REDO_RUN}, or pass --min-agreement"
            )
        recorded.append(float(loss))
    losses = recorded or [s.tolerable_loss for s in recipe_of_run(run_dir).stages if s.type == "quantize"]
    return round(1.0 - min(losses), 6) if losses else None


def _texts(run_dir: Path | None, data: Path | None) -> tuple[list[str], list[str] | None, str]:
    if (run_dir is None) == (data is None):
        raise CompressError(
            "verify-arm needs the texts to compare on: --run RUN (its eval split) or --data FILE"
        )
    if data is not None:
        from compress.runtime.runner import RunnerError, read_inputs

        try:
            texts, pairs = read_inputs(data)
        except RunnerError as exc:
            raise CompressError(str(exc)) from None
        return texts, pairs, str(data)
    from compress.data import load_recipe_split
    from compress.subjects import recipe_of_run

    split = load_recipe_split(recipe_of_run(run_dir, data=True), "eval")
    return split.texts, split.pairs, f"{run_dir} eval split ({split.source})"


@click.command("verify-arm")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--run",
    "run_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Compare on this run's eval split.",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Compare on these texts: .txt (one per line), .tsv (text<TAB>pair) or .jsonl ({text, pair}).",
)
@click.option(
    "--cache",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where the emulated arm64 root is kept between runs [default: ~/.cache/compress/arm64-root].",
)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), help="Also write the result as JSON.")
@click.option(
    "--tie-margin",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Accept a differing label when the host's top two logits are this close (int8 kernels of two "
    "interpreter versions differ slightly); every difference is still printed.",
)
@click.option(
    "--min-agreement",
    type=click.FloatRange(min=0, max=1),
    default=None,
    help="Pass when at least this share of labels match the host's (int8 kernels of two instruction sets "
    "can round a near tie apart); every difference is printed. [default: with --run, 1 - the "
    "tolerable_loss its quantize stage ran with; else 1.0]",
)
@click.pass_context
def verify_arm_cmd(
    ctx: click.Context,
    bundle: Path,
    run_dir: Path | None,
    data: Path | None,
    cache: Path | None,
    out: Path | None,
    tie_margin: float,
    min_agreement: float | None,
) -> None:
    """Run BUNDLE on emulated arm64 (bookworm under qemu) with each of its interpreters; labels must agree
    with the host's labels of the model each interpreter picks. A pass is recorded in BUNDLE.verified.json."""
    from compress.arm import remove_verification, verify_arm, write_verification
    from compress.io import check_output_path, write_json_atomic
    from compress.terminal import quieted

    remove_verification(bundle)  # before any work: a run that fails anywhere leaves no earlier record
    if out is not None:
        check_output_path(out)
    texts, pairs, source = _texts(run_dir, data)
    if min_agreement is None:
        min_agreement = (recipe_min_agreement(run_dir) if run_dir is not None else None) or 1.0
    with quieted():  # the host interpreter's C++ lines ("Created ... XNNPACK delegate") stay off the terminal
        result = verify_arm(
            bundle, texts, pairs, root_cache=cache, tie_margin=tie_margin, min_agreement=min_agreement
        )
    click.echo(
        f"{bundle}: {_megabytes(result['bundle_bytes'])}, {result['artifact']}; "
        f"{len(texts)} texts from {source}; pass at {min_agreement:.2%} of labels as on the host"
    )
    host = result["host"]["interpreter"]
    for run in result["runs"]:
        name = f"  {run['requirements']:34}"
        if "error" in run:
            click.echo(f"{name} FAILED: {run['error']}")
            continue
        interpreter = (
            f"{run['interpreter']['name']} {run['interpreter']['version']} on {run['machine']} "
            f"running {run['model']}"
        )
        click.echo(
            f"{name} {interpreter}: {run['agree']}/{run['total']} labels as on the host "
            f"({host['name']} {host['version']}), max |logit diff| {run['max_abs_logit_diff']:.2e}"
        )
        if run["differing_lines"]:
            click.echo(
                f"    labels differ on text lines {run['differing_lines']}; host margins "
                f"{run['host_margins']}; {run['near_ties']} within --tie-margin {tie_margin}"
            )
    if out is not None:
        write_json_atomic(out, result)
    record = write_verification(bundle, result)
    if record is not None:
        click.echo(f"verified: {record}")
    if not result["ok"]:
        click.echo(
            "verify-arm: the emulated arm64 predictions differ from the host's (or did not run)", err=True
        )
        ctx.exit(1)


@click.command("check-parity")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--port",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Your tokenizer port's answers, one JSON object per case and line: "
    '{"id", "input_ids", "attention_mask", "token_type_ids"} or {"id", "refused": true}.',
)
@click.pass_context
def check_parity_cmd(ctx: click.Context, bundle: Path, port: Path | None) -> None:
    """Check BUNDLE's tokenizer parity vectors (a .tar.gz or unpacked folder): without --port, that the
    runner and tokenizer.json still give every carried array; with --port, that a port gives them."""
    from compress.parity import check_bundle

    result = check_bundle(bundle, port)
    who = f"{port}" if port is not None else "the runner with this tokenizers"
    problems = result["problems"]
    for line in problems:
        click.echo(f"  {line}")
    verdict = f"{len(problems)} difference(s), listed above" if problems else "every array matches"
    click.echo(f"{bundle}: {result['cases']} parity cases checked against {who}: {verdict}")
    if problems:
        ctx.exit(1)


COMMANDS = (bundle_cmd, verify_arm_cmd, check_parity_cmd)
