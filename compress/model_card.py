"""Model cards in the Hugging Face format (YAML metadata, then what a reader needs), for a deploy bundle
and for every artifact folder of a run.

The card says what the artifact is (format, precision, target, labels, the longest input), how to run
it with the bundle's own runner, and what it was checked against: the numbers come from the run's
report (accuracy, agreement with the teacher, latency and bytes, beside the teacher's own), and only
when the report measured this very model file (same sha256). Without a matching report the card says
so instead of quoting numbers that belong to another file. An artifact folder's card is written when
the run's report is (``write_artifact_cards``), beside the files its manifest lists: README.md is not
one of them, so the card never changes a hash a manifest records.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml

from compress.errors import CompressError
from compress.run_layout import CARD_FILE, MANIFEST_FILE

log = logging.getLogger(__name__)


def report_entry(report: dict[str, Any] | None, name: str, model_sha256: str) -> dict[str, Any] | None:
    """The report's entry for this artifact, if the report measured this exact model file."""
    if not report:
        return None
    for entry in report.get("artifacts") or []:
        if entry.get("name") == name and entry.get("sha256") == model_sha256:
            return entry
    return None


def _pct(value: Any) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{100 * value:.2f}"


def _ms(metrics: dict[str, Any]) -> str:
    p50 = (metrics.get("latency_ms") or {}).get("p50")
    return "n/a" if not isinstance(p50, int | float) else f"{p50:.2f}"


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def origin(report: dict[str, Any] | None) -> str | None:
    """The model the run started from: the recipe's Hub id when it named one (run.json's teacher_hub),
    else the first stage's input as its manifest records it, else the report's teacher. None when none
    can be read."""
    from compress.subjects import read_run_file, read_stage_manifest

    run = (report or {}).get("run")
    try:
        run_file = read_run_file(Path(run)) if isinstance(run, str) and run else None
        if run_file is not None and run_file.teacher_hub:
            return run_file.teacher_hub
        stages = run_file.stages if run_file is not None else []
        manifest = read_stage_manifest(Path(run) / stages[0].dir) if stages else None
    except CompressError:
        manifest = None
    inputs = (manifest.model_extra or {}).get("inputs") if manifest is not None else None
    start = inputs.get("input_dir") if isinstance(inputs, dict) else None
    start = start or ((report or {}).get("teacher") or {}).get("path")
    return start if isinstance(start, str) and start else None


def hub_id(name: str | None) -> str | None:
    """``name`` if it reads as a Hugging Face Hub id (owner/model) and is no folder here."""
    return name if name and HUB_ID.match(name) and not Path(name).exists() else None


def shown_name(name: str) -> str:
    """A Hub id as is; a local folder by its last two path parts (no home folders in a shipped card)."""
    return name if hub_id(name) else "/".join(Path(name).parts[-2:])


def metadata(manifest: dict[str, Any], labels: list[str], entry: dict[str, Any] | None, report: Any) -> dict:
    """The card's YAML header: the keys the Hugging Face Hub reads (pipeline_tag, tags, base_model when
    the run started from a Hub id, license, datasets, model-index with the measured metrics)."""
    meta: dict[str, Any] = {
        "pipeline_tag": "text-classification",
        "library_name": "onnxruntime" if manifest["format"] == "onnx" else "litert",
        "license": "unknown",
        "tags": ["compress", manifest["format"], str(manifest.get("precision")), str(manifest.get("target"))],
    }
    if hub_id(origin(report)):
        meta["base_model"] = origin(report)
    data = (report or {}).get("data") or {}
    if data.get("source"):
        meta["datasets"] = [Path(str(data["source"])).name]
    if entry is not None:
        metrics = entry.get("metrics") or {}
        results = [
            {"type": key, "value": round(float(metrics[key]), 4)}
            for key in ("accuracy", "f1", "agreement")
            if isinstance(metrics.get(key), int | float)
        ]
        meta["model-index"] = [
            {
                "name": str(manifest.get("name")),
                "results": [
                    {
                        "task": {"type": "text-classification"},
                        "dataset": {"name": meta.get("datasets", ["eval split"])[0], "type": "local"},
                        "metrics": results,
                    }
                ],
            }
        ]
    meta["labels"] = list(labels)
    return meta


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_lines(check: dict[str, Any]) -> list[str]:
    """The artifact manifest's ``check`` in words: the export's logit difference against PyTorch, and a
    quantized model's labels kept against the fp32 artifact it came from (``eval``)."""
    lines = []
    if _number(check.get("max_abs_diff")):
        tolerance = ", ".join(f"{k} {check[k]}" for k in ("atol", "rtol") if _number(check.get(k)))
        lines.append(
            "At export, against the PyTorch model it was made from: largest logit difference "
            f"{check['max_abs_diff']:.2e}{f' (tolerance {tolerance})' if tolerance else ''}."
        )
    measured = check.get("eval") if isinstance(check.get("eval"), dict) else {}
    if _number(measured.get("agreement")):
        accuracy = (
            f"; accuracy {_pct(measured['float_accuracy'])}% -> {_pct(measured['accuracy'])}%"
            if _number(measured.get("accuracy")) and _number(measured.get("float_accuracy"))
            else ""
        )
        lines.append(
            f"Quantized, against the fp32 artifact it came from on {measured.get('samples', '?')} eval rows: "
            f"{_pct(measured['agreement'])}% of its labels kept{accuracy}."
        )
    return [*lines, ""] if lines else []


def bundle_usage(bundle_name: str, pair: bool, kit: bool = False) -> list[str]:
    """How to run the model from its bundle."""
    lines = [
        "```bash",
        f"tar xzf {bundle_name} && cd {bundle_name.removesuffix('.tar.gz')}",
        "pip install -r requirements.txt",
        'python3 runner.py predict "some text"' + (' --pair "another text"' if pair else ""),
        "```",
        "",
        "`runner.py` checks the sha256 of every file listed in `manifest.json` before it loads the model.",
    ]
    if kit:
        lines += [
            "",
            "**In an app** (Kotlin, Swift): `io-contract.json` gives the input names, dtypes and "
            "shapes per signature, the output, the labels and the tokenizer's settings; "
            "`parity-vectors.json` gives, for a few hundred texts, the exact `input_ids`, "
            "`attention_mask` and `token_type_ids` the runner feeds. A tokenizer port is right when it "
            "fills the same arrays for every case (and refuses the cases marked `refused`).",
        ]
    return lines


def folder_usage(manifest: dict[str, Any], folder: Path, pair: bool) -> list[str]:
    """How to run the model from its artifact folder (on the host), and how to ship it."""
    target = manifest.get("target") or "TARGET"
    run = folder.parent.parent
    return [
        "```bash",
        f'python -m compress.runtime.runner --dir {folder} predict "some text"'
        + (' --pair "another text"' if pair else ""),
        f"compress bundle {run} --target {target}   # everything a device needs, in one tar.gz",
        "```",
        "",
        "The runner checks the sha256 of every file listed in `manifest.json` before it loads the model; "
        "`model.*` takes `input_ids`, `attention_mask` (and `token_type_ids`) and returns `logits` "
        "(see `manifest.json` for names, dtypes and shapes).",
    ]


def model_card(
    manifest: dict[str, Any],
    labels: list[str],
    report: dict[str, Any] | None,
    model_sha256: str,
    usage: list[str],
) -> str:
    """README.md of a bundle or artifact folder: YAML metadata between ``---`` lines, then Markdown.
    ``usage`` is the "How to run it" section (``bundle_usage`` or ``folder_usage``)."""
    name = str(manifest.get("name"))
    entry = report_entry(report, name, model_sha256)
    meta = metadata(manifest, labels, entry, report)
    pair = bool((manifest.get("task") or {}).get("text_pair"))
    check = (manifest.get("source") or {}).get("check") or {}
    start = origin(report) or (manifest.get("source") or {}).get("checkpoint")
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# {name}",
        "",
        f"A text classifier in {manifest['format'].upper()} ({manifest.get('precision')}) for "
        f"`{manifest.get('target')}`, made by compress from "
        f"{f'`{shown_name(start)}`' if start else 'its teacher'}. Labels: {', '.join(labels)}. "
        f"{'Inputs are sentence pairs. ' if pair else ''}"
        f"Texts longer than {manifest.get('max_length')} tokens are truncated.",
        "",
        "## How to run it",
        "",
        *usage,
        "",
        "## What it was checked against",
        "",
    ]
    lines += check_lines(check)
    if entry is None:
        lines.append(
            "No report of the run measured this model file; run `compress report RUN` and bundle again "
            "for accuracy, agreement, latency and bytes beside the teacher."
        )
    else:
        teacher = (report or {}).get("teacher") or {}
        tm, em = teacher.get("metrics") or {}, entry.get("metrics") or {}
        host = (report or {}).get("host") or {}
        lines += [
            f"On the run's `{(report or {}).get('split', 'eval')}` split "
            f"({((report or {}).get('data') or {}).get('rows', '?')} rows), measured on the build host "
            f"({host.get('machine', '?')}, {host.get('cpus', '?')} CPUs), batch 1:",
            "",
            "| model | accuracy % | agreement with the teacher % | p50 ms | MB |",
            "|---|---|---|---|---|",
            f"| teacher ({teacher.get('format', '?')} {teacher.get('precision', '')}) "
            f"| {_pct(tm.get('accuracy'))} | 100.00 | {_ms(tm)} | {teacher.get('bytes', 0) / 1e6:.1f} |",
            f"| this model | {_pct(em.get('accuracy'))} | {_pct(em.get('agreement'))} | {_ms(em)} "
            f"| {entry.get('bytes', 0) / 1e6:.1f} |",
            "",
            "Latency on the device differs: the bundle's `python3 runner.py benchmark --out device.json` "
            "measures it there.",
        ]
    return "\n".join(lines) + "\n"


def artifact_card(folder: Path, report: dict[str, Any]) -> str:
    """The card of one artifact folder, its manifest and labels read through their checked schemas."""
    from compress.subjects import read_artifact_manifest, read_labels

    checked = read_artifact_manifest(folder)
    source = checked.model_dump(by_alias=True)
    model_file = f"model.{checked.format}"
    model_sha = next((e.sha256 for e in checked.files if e.path == model_file), "")
    manifest = {**source, "source": {**(source.get("source") or {}), "check": source.get("check")}}
    pair = bool((source.get("task") or {}).get("text_pair"))
    labels = read_labels(folder / "labels.json")
    return model_card(manifest, labels, report, model_sha, folder_usage(source, folder, pair))


def write_artifact_cards(report: dict[str, Any]) -> list[Path]:
    """README.md in every artifact folder the report measured, filled from the report. A folder that is
    gone (a report read on another machine) or unreadable is skipped with a warning: the report itself
    is written either way."""
    from compress.io import write_text_atomic
    from compress.subjects import is_artifact_folder, present

    written = []
    for entry in report.get("artifacts") or []:
        path = entry.get("path")
        folder = Path(path) if isinstance(path, str) and path else None
        if folder is None or not present(folder / MANIFEST_FILE):
            continue
        try:
            if not is_artifact_folder(folder):
                continue
            write_text_atomic(folder / CARD_FILE, artifact_card(folder, report))
        except CompressError as exc:
            log.warning("model card for %s not written: %s", entry.get("name"), exc)
            continue
        written.append(folder / CARD_FILE)
    return written
