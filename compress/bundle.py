"""Deploy bundles: one tar.gz with everything a board needs to classify text, and nothing it does not.

A bundle holds the run's artifact for one target (int8 when the run made one), its tokenizer and
label names, the single-file runner, requirements for the device and a manifest with the sha256 of
every file. The runner checks that manifest before it loads the model, so a bundle copied to a
board either runs exactly what compress checked or refuses to run. torch and transformers never
go in: the board installs numpy, tokenizers and an interpreter only.

A TFLite bundle offers a requirements file per interpreter its artifact names for one of its models
(the manifest's runtime contracts and fallbacks): ai-edge-litert always, tflite-runtime 2.14 only where a
model was made for it. A Pi's dynamic int8 artifact names it for its weight-only fallback; a phone's
does not, since an app links LiteRT (com.google.ai.edge.litert), not a Linux wheel, and tflite-runtime
2.14 computes the dynamic int8 model wrongly (121/250 labels as the host under emulated aarch64).

A bundle for a phone (a target named android-* or ios-*, or any target with ``app_kit``) also carries
the app developer's kit (``compress.parity``): the I/O contract as JSON and tokenizer parity vectors,
since an app ports the tokenizer instead of running runner.py. A board's bundle does not: its runner
is the application.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Any

from compress.errors import CompressError
from compress.io import atomic_path, sha256_file
from compress.model_card import bundle_usage, model_card
from compress.run_layout import CARD_FILE, MANIFEST_FILE, REPORT_FILE
from compress.subjects import REDO_ARTIFACT, artifact_fallbacks, read_artifact_manifest, read_labels

log = logging.getLogger(__name__)

BUNDLE_SCHEMA = "compress.bundle/1"
RUNNER = Path(__file__).resolve().parent / "runtime" / "runner.py"
KEPT = ("name", "format", "target", "precision", "quantization", "inputs", "outputs", "max_length")
KEPT_IF_PRESENT = ("runtime", "fallbacks")
"""TFLite: the runtime contract (ops, op versions, interpreters that loaded the model) and fallback models."""
FALLBACK_TFLITE = ("tflite-runtime==2.14.0", "numpy<2", "tokenizers>=0.19")
TFLITE_RUNTIME_FILE = "requirements-tflite-runtime.txt"


def choose_artifact(run_dir: Path, target: str) -> Path:
    """The run's artifact for ``target``: int8 over fp32, then the latest stage (quantize follows export)."""
    from compress.subjects import run_subjects

    artifacts = [s for s in run_subjects(run_dir) if s.role == "artifact"]
    matching = [s for s in artifacts if s.target == target]
    if not matching:
        made = sorted({str(s.target) for s in artifacts}) or ["none"]
        raise CompressError(
            f"{run_dir}: no artifact for target '{target}' (this run made: {', '.join(made)}); "
            "add the target to the recipe's targets and run it again"
        )
    best = max(enumerate(matching), key=lambda pair: (pair[1].precision == "int8", pair[0]))[1]
    log.info("bundling %s (%s, %s)", best.name, best.format, best.precision)
    return best.path


def named_interpreters(source: dict[str, Any]) -> set[str]:
    """The interpreters an artifact's manifest names for one of its models: those its runtime contract
    loaded (or would have, were they installed) at export, and each fallback model's. An artifact
    written before compress kept runtime contracts names none, and its bundle offers the primary only."""
    runtime = source.get("runtime") if isinstance(source.get("runtime"), dict) else {}
    loaded = runtime.get("loaded_at_export") or []
    named = {entry.get("interpreter") for entry in loaded if isinstance(entry, dict)}
    named |= {entry.get("interpreter") for entry in source.get("fallbacks") or [] if isinstance(entry, dict)}
    return {name for name in named if isinstance(name, str)}


def requirement_lines(fmt: str, interpreters: set[str] | None = None) -> dict[str, list[str]]:
    """Device requirements per file, with the interpreter versions compress itself checked against.
    TFLite: ai-edge-litert always; tflite-runtime 2.14 when ``interpreters`` names it (a model made
    for it: ``named_interpreters``)."""

    def at_least(package: str) -> str:
        try:
            return f"{package}>={metadata.version(package)}"
        except metadata.PackageNotFoundError:
            return package

    tokenizers = f"tokenizers>={'.'.join(metadata.version('tokenizers').split('.')[:2])}"
    if fmt == "onnx":
        return {"requirements.txt": [at_least("onnxruntime"), "numpy", tokenizers]}
    files = {"requirements.txt": [at_least("ai-edge-litert"), "numpy", tokenizers]}
    if "tflite_runtime" in (interpreters or set()):
        files[TFLITE_RUNTIME_FILE] = list(FALLBACK_TFLITE)
    return files


def readme_text(manifest: dict[str, Any], labels: list[str], bundle_name: str, names: set[str]) -> str:
    """README.txt; ``names`` are the bundle's file names (which requirements files it offers)."""
    if TFLITE_RUNTIME_FILE in names:
        extra = (
            "  # or, where ai-edge-litert has no wheel (Python <= 3.11):\n"
            f"  #   pip install -r {TFLITE_RUNTIME_FILE}\n"
        )
    elif manifest["format"] == "tflite":
        extra = "  # (tflite-runtime is not offered: no model in this bundle was made for it)\n"
    else:
        extra = ""
    links = (
        "An app loads model.tflite with LiteRT (on Android: com.google.ai.edge.litert), not tflite-runtime.\n"
        if manifest["format"] == "tflite"
        else ""
    )
    kit = (
        f"{links}"
        "For an app (Kotlin, Swift) that ports the tokenizer: io-contract.json (inputs, outputs, labels,\n"
        "tokenizer settings) and parity-vectors.json (the exact arrays runner.py feeds for a few hundred\n"
        "texts; a port must fill the same).\n"
        "On the host, compress check-parity BUNDLE --port OUT.jsonl compares a port's arrays with them.\n\n"
        if manifest.get("app_kit")
        else ""
    )
    picks = "".join(
        f"runner.py runs {entry['path']} ({entry['scheme']}) under {entry['interpreter']} "
        f"< {entry['below']}, model.tflite under any other interpreter, and says which on stderr: "
        f"{entry['reason']}\n"
        for entry in manifest.get("fallbacks") or []
    )
    return (
        f"{bundle_name}: {manifest['name']} ({manifest['format']}, {manifest['precision']}) "
        f"for {manifest['target']}\n"
        f"Labels: {', '.join(labels)}. Texts longer than {manifest['max_length']} tokens "
        "are truncated.\n\n"
        "Install (Python 3.10 or newer; Raspberry Pi OS bookworm has 3.11):\n"
        "  python3 -m venv ~/compress-env && . ~/compress-env/bin/activate\n"
        f"  pip install -r requirements.txt\n{extra}\n"
        "Run:\n"
        '  python3 runner.py predict "some text"\n'
        "  python3 runner.py predict --file texts.txt --out predictions.jsonl   # .txt, .tsv or .jsonl\n"
        "  python3 runner.py benchmark --out device.json\n\n"
        f"{picks}"
        f"{kit}"
        "runner.py checks the sha256 of every file in manifest.json before loading the model.\n"
        "On the host, merge device.json into the run's report:\n"
        "  compress report RUN --device-results device.json\n"
    )


def bundle_files(
    artifact: Path,
    target_threads: int,
    bundle_name: str,
    report: dict[str, Any] | None = None,
    *,
    app_kit: bool = False,
) -> dict[str, bytes]:
    """Every file of the bundle by name, the artifact's own files checked against its manifest first.

    ``report`` (the run's report.json) gives the model card its measured numbers; ``app_kit`` adds
    io-contract.json and parity-vectors.json (``compress.parity``)."""
    checked = read_artifact_manifest(artifact)
    source = checked.model_dump(by_alias=True)
    model_file = f"model.{checked.format}"
    if model_file not in {entry.path for entry in checked.files}:
        raise CompressError(f"{artifact / MANIFEST_FILE}: files does not list {model_file}; {REDO_ARTIFACT}")
    files: dict[str, bytes] = {}
    for entry in checked.files:
        path = artifact / entry.path
        if not path.resolve().is_relative_to(artifact.resolve()):
            raise CompressError(
                f"{artifact / MANIFEST_FILE}: {entry.path!r} links outside the artifact folder; "
                f"{REDO_ARTIFACT}"
            )
        if not path.is_file() or sha256_file(path) != entry.sha256:
            raise CompressError(f"{path}: missing or changed since export (sha256); run the recipe again")
        files[entry.path] = path.read_bytes()
    artifact_fallbacks(artifact, checked)
    manifest = {key: source.get(key) for key in KEPT}
    manifest.update({key: source[key] for key in KEPT_IF_PRESENT if key in source})
    if not checked.fallbacks:
        manifest.pop("fallbacks", None)  # an artifact without fallback models says nothing of them
    manifest.update(
        schema=BUNDLE_SCHEMA,
        kind="bundle",
        sequence_lengths=source.get("sequence_lengths"),
        task=source.get("task") or {"text_pair": False},
        threads=target_threads,
        source={"artifact": str(artifact), "check": source.get("check")},
    )
    files["runner.py"] = RUNNER.read_bytes()
    for name, lines in requirement_lines(manifest["format"], named_interpreters(source)).items():
        files[name] = ("\n".join(lines) + "\n").encode()
    labels = read_labels(artifact / "labels.json")
    if app_kit:
        from compress.parity import CONTRACT_FILE, PARITY_FILE
        from compress.parity import app_kit as make_kit

        files.update(make_kit(artifact, manifest, labels))
        manifest["app_kit"] = {"io_contract": CONTRACT_FILE, "parity_vectors": PARITY_FILE}
    files["README.txt"] = readme_text(manifest, labels, bundle_name, set(files)).encode()
    model_sha = next(e.sha256 for e in checked.files if e.path == model_file)
    card_source = {**manifest, "source": {**(source.get("source") or {}), "check": source.get("check")}}
    pair = bool(manifest["task"].get("text_pair"))
    usage = bundle_usage(bundle_name, pair, kit=app_kit)
    files[CARD_FILE] = model_card(card_source, labels, report, model_sha, usage).encode()
    manifest["files"] = [
        {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in sorted(files.items())
    ]
    files[MANIFEST_FILE] = (json.dumps(manifest, indent=2, default=str) + "\n").encode()
    return files


def write_tar(out_file: Path, folder: str, files: dict[str, bytes], mtime: int) -> None:
    """A gzip tarball with fixed times and owners, so the same artifact always gives the same bytes."""
    with (
        atomic_path(out_file) as tmp,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=mtime) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o755 if name == "runner.py" else 0o644
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
        tmp.chmod(0o644)


def make_bundle(
    run_dir: str | Path, target: str, out_file: str | Path | None = None, *, app_kit: bool | None = None
) -> dict[str, Any]:
    """Pack the run's artifact for ``target`` (default file: RUN/bundles/<run>-<target>.tar.gz).

    ``app_kit``: add the app developer's kit; None adds it for phone targets (``is_phone_target``)."""
    from compress.io import require_path
    from compress.parity import is_phone_target
    from compress.report_file import load_report
    from compress.targets import load_target

    run_dir = require_path(run_dir, "point at a run folder (runs/<name>)")
    if not run_dir.is_dir():
        raise CompressError(f"{run_dir}: not a folder; point at a run folder (runs/<name>)")
    profile = load_target(target)
    artifact = choose_artifact(run_dir, target)
    folder = f"{run_dir.resolve().name}-{target}"
    out = Path(out_file) if out_file else run_dir / "bundles" / f"{folder}.tar.gz"
    report_file = run_dir / REPORT_FILE
    report = load_report(report_file) if report_file.exists() else None
    kit = is_phone_target(target) if app_kit is None else app_kit
    files = bundle_files(artifact, profile.threads, f"{folder}.tar.gz", report, app_kit=kit)
    manifest = read_artifact_manifest(artifact)
    write_tar(out, folder, files, int((artifact / f"model.{manifest.format}").stat().st_mtime))
    return {
        "path": str(out),
        "bytes": out.stat().st_size,
        "sha256": sha256_file(out),
        "folder": folder,
        "artifact": manifest.name or str(artifact),
        "format": manifest.format,
        "precision": manifest.precision,
        "target": target,
        "app_kit": kit,
        "files": {name: len(data) for name, data in sorted(files.items())},
    }
