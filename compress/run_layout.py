"""The run folder's names: every file and folder name compress writes into a run, in one place.

A run folder (``runs/<recipe>/`` by default) looks like this::

    runs/<recipe>/
    ├── .lock                     LOCK_FILE: held while a compress process runs the recipe
    ├── .cache/                   CACHE_DIR: teacher outputs, checkpoints; shared across stages and reruns
    ├── plan.json                 PLAN_FILE: what the run is made from, written before the first stage
    ├── run.log                   RUN_LOG: other libraries' warnings and logs
    ├── 01-distill/               stage_dir_name(1, "distill"): a stage folder
    │   ├── manifest.json         MANIFEST_FILE: the stage's manifest (config, hash, what it produced)
    │   └── ...                   the model the stage produced
    ├── 02-export/                a stage that produces artifacts
    │   ├── manifest.json
    │   └── arm64-onnx-fp32/      artifact_dir_name("arm64-onnx", "fp32"): an artifact folder
    │       ├── manifest.json     MANIFEST_FILE: the artifact's manifest (kind: artifact, files, ...)
    │       ├── README.md         CARD_FILE: its model card, written by ``compress report``
    │       └── model.onnx, tokenizer.json, labels.json
    ├── 03-quantize/
    │   ├── manifest.json
    │   └── arm64-onnx-int8/      artifact_dir_name("arm64-onnx", "int8")
    ├── run.json                  RUN_FILE: which stage folders belong to the run, written last
    ├── report.json               REPORT_FILE: the report (the record), written last of the report's files
    ├── report.md                 REPORT_MARKDOWN: the report for people
    └── report.png                REPORT_PLOT: the accuracy/latency trade-off

Only the names live here. What these files hold, their schemas, are the typed models in
``compress.subjects`` (``RunFile`` for run.json, ``PlanFile`` for plan.json, ``StageManifest`` and
``ArtifactManifest`` for manifest.json) and ``compress.report_file`` (``ReportFile`` for
report.json). This module imports nothing from compress, so every layer may use it, except
``compress.runtime``, which ships alone in a device bundle and spells its few names itself.
"""

from __future__ import annotations

from typing import Literal

Precision = Literal["fp32", "int8"]

MANIFEST_FILE = "manifest.json"
"""In every stage folder and every artifact folder (and in a bundle, the artifact's)."""
RUN_FILE = "run.json"
PLAN_FILE = "plan.json"
REPORT_FILE = "report.json"
REPORT_MARKDOWN = "report.md"
REPORT_PLOT = "report.png"
RUN_LOG = "run.log"
LOCK_FILE = ".lock"
CACHE_DIR = ".cache"
CARD_FILE = "README.md"
"""An artifact folder's (and a bundle's) model card; not listed in the artifact's manifest."""


def stage_dir_name(index: int, stage_type: str) -> str:
    """The folder of a run's ``index``-th stage (from 1), e.g. ``02-distill``."""
    return f"{index:02d}-{stage_type}"


def artifact_dir_name(target: str, precision: Precision) -> str:
    """The folder of one target profile's artifact inside a stage folder, e.g. ``arm64-onnx-int8``."""
    return f"{target}-{precision}"
