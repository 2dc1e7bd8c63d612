"""The bad-input catalogue: ways a user can hand compress a broken input, each through the real CLI.

Every case expects exit status 2 (1 for a failed gate), exactly one ``error:`` line on stderr that
names the problem and the fix, no traceback, and nothing half-written left behind: no new ``.tmp``
name anywhere and no stage folder without a complete manifest (the run folder's ``.lock`` and the
teacher-output cache may stay). Most cases fail while the recipe is validated; the rest use the tiny
model and stop before training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.tiny import write_recipe

FINETUNE = "  - type: finetune\n    epochs: 1\n"
DISTILL = "  - type: distill\n    layers: 1\n    epochs: 1\n"
SHARE = "  - type: share\n    recovery: null\n"


@dataclass
class Workspace:
    """A folder with the tiny teacher, the reviews data and an --out folder, for one case."""

    root: Path
    teacher: Path
    data: dict[str, Path]
    out: Path
    env: dict[str, str]
    module: str = "compress.cli"
    preexec: Callable[[], None] | None = None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def recipe(self, stages: str = FINETUNE, extra: str = "") -> Path:
        """The tiny recipe (task labels negative/positive, teacher, reviews data) with ``stages``."""
        return write_recipe(
            self.root / "r.yaml", teacher=self.teacher, data=self.data, stages=stages, extra=extra
        )

    def edit(self, path: Path, old: str, new: str) -> Path:
        text = path.read_text()
        assert old in text, f"{old!r} not in the recipe"
        path.write_text(text.replace(old, new))
        return path

    def run(self, recipe: Path, *extra: str) -> list[str]:
        return ["run", str(recipe), "--out", str(self.out), *extra]

    def own_teacher(self) -> Path:
        """A private copy of the tiny teacher that a case may damage."""
        copy = self.root / "teacher"
        if not copy.exists():
            shutil.copytree(self.teacher, copy)
        self.teacher = copy
        return copy

    def data_file(self, name: str, content: bytes | str, split: str = "train") -> None:
        path = self.root / "data" / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        self.data = {**self.data, {"train": "train", "eval": "dev", "test": "test"}[split]: path}


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Workspace], list[str]]
    expect: tuple[str, ...]
    """Substrings of the error line (case-insensitive): the key or file, and the fix."""
    code: int = 2
    xfail: str | None = None


# -- recipe files ------------------------------------------------------------------------------------


def _yaml(text: str) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        path = ws.root / "r.yaml"
        path.write_text(text)
        return ws.run(path)

    return build


def _edited(old: str, new: str, stages: str = FINETUNE, extra: str = "") -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        return ws.run(ws.edit(ws.recipe(stages, extra), old, new))

    return build


def _stages(stages: str, extra: str = "") -> Callable[[Workspace], list[str]]:
    return lambda ws: ws.run(ws.recipe(stages, extra))


def _recipe_folder(ws: Workspace) -> list[str]:
    (ws.root / "folder.yaml").mkdir()
    return ws.run(ws.root / "folder.yaml")


def _recipe_latin1(ws: Workspace) -> list[str]:
    path = ws.recipe()
    path.write_bytes(path.read_bytes().replace(b"name: tiny", b"name: tiny\ndescription: caf\xe9"))
    return ws.run(path)


def _python_tag(ws: Workspace) -> list[str]:
    marker = ws.root / "PWNED"
    path = ws.root / "r.yaml"
    path.write_text(f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    return ws.run(path)


def _override(text: str) -> Callable[[Workspace], list[str]]:
    return lambda ws: ws.run(ws.recipe(), "--set", text)


# -- data files --------------------------------------------------------------------------------------


def _data(name: str, content: bytes | str, split: str = "train", stages: str = FINETUNE, **edits: str):
    def build(ws: Workspace) -> list[str]:
        ws.data_file(name, content, split)
        path = ws.recipe(stages)
        for old, new in edits.values():
            ws.edit(path, old, new)
        return ws.run(path)

    return build


def _data_folder(ws: Workspace) -> list[str]:
    path = ws.edit(
        ws.recipe(), f"eval: {{path: {ws.data['dev']}}}", f"eval: {{path: {ws.root}, format: tsv}}"
    )
    return ws.run(path)


def _three_labels() -> str:
    return "sentence\tlabel\n" + "good film\t0\nbad film\t1\nthe film\t2\n" * 8


NO_TASK_LABELS = (", labels: [negative, positive]", "")

# -- model folders -----------------------------------------------------------------------------------


def _teacher(damage: Callable[[Path], None], stages: str = FINETUNE) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        damage(ws.own_teacher())
        return ws.run(ws.recipe(stages))

    return build


def _no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _garbage(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x00" * 4096)


def _pickle_only(folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _bad_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "bert", ')


# -- targets -----------------------------------------------------------------------------------------

TINY_BOARD = """name: tiny-board
format: onnx
runtime: onnxruntime
threads: 1
sequence_lengths: [16]
input_dtype: int64
quantization: {schemes: [dynamic]}
"""


def _own_targets(ws: Workspace, text: str, name: str = "tiny-board") -> None:
    folder = ws.root / "targets"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    ws.env["COMPRESS_TARGETS"] = str(folder)


def _static_on_dynamic_only(ws: Workspace) -> list[str]:
    _own_targets(ws, TINY_BOARD)
    stages = FINETUNE + "  - type: quantize\n    scheme: static\n"
    return ws.run(ws.recipe(stages, "targets: [tiny-board]\n"))


def _broken_profile(ws: Workspace) -> list[str]:
    _own_targets(ws, TINY_BOARD.replace("threads: 1", "threads: -4"))
    return ["targets"]


def _misnamed_profile(ws: Workspace) -> list[str]:
    _own_targets(ws, TINY_BOARD, name="pi")
    return ["targets"]


# -- the environment ---------------------------------------------------------------------------------


def _out_under_file(ws: Workspace) -> list[str]:
    (ws.root / "a-file").write_text("not a folder\n")
    ws.out = ws.root / "a-file" / "runs"
    return ws.run(ws.recipe())


def _out_in_proc(ws: Workspace) -> list[str]:
    ws.out = Path("/proc/compress-runs")
    return ws.run(ws.recipe())


def _file_size_limit(ws: Workspace) -> list[str]:
    """RLIMIT_FSIZE makes every write past 20 kB fail with EFBIG (Python ignores SIGXFSZ)."""
    ws.preexec = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    return ws.run(ws.recipe())


def _full_disk(ws: Workspace) -> list[str]:
    """A 64 kB tmpfs as --out: the stage's copy of the 100 kB teacher hits ENOSPC."""
    disk = ws.root / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the file-size-limit case covers the write path")
    ws.cleanups.append(lambda: subprocess.run(["umount", str(disk)], check=False))
    ws.out = disk
    return ws.run(ws.recipe())


def _locked(ws: Workspace) -> list[str]:
    """A second ``compress run`` while a first one is training into the same run folder."""
    busy = ws.recipe("  - type: finetune\n    when: always\n    epochs: 400\n    batch_size: 16\n")
    first = subprocess.Popen(
        [sys.executable, "-m", "compress.cli", *ws.run(busy)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ws.env,
    )
    ws.cleanups.append(lambda: (first.kill(), first.wait()))
    deadline = time.time() + 120
    while not list((ws.out / "tiny").glob(".01-finetune.tmp-*")):
        assert first.poll() is None and time.time() < deadline, "the first run ended before it was busy"
        time.sleep(0.2)
    return ws.run(busy)


def _tampered_bundle(ws: Workspace) -> list[str]:
    """An unpacked deploy bundle whose model file changed after compress wrote its manifest."""
    from compress.bundle import bundle_files, write_tar
    from tests.helpers.artifacts import make_artifact

    artifact = make_artifact(ws.teacher, ws.root / "artifact", "onnx", [16])
    write_tar(ws.root / "b.tar.gz", "b", bundle_files(artifact, 1, "b.tar.gz"), 0)
    with tarfile.open(ws.root / "b.tar.gz") as tar:
        tar.extractall(ws.root / "unpacked", filter="data")
    model = ws.root / "unpacked" / "b" / "model.onnx"
    model.write_bytes(model.read_bytes()[:-64] + b"\x00" * 64)
    ws.module = "compress.runtime.runner"
    return ["--dir", str(model.parent), "predict", "a good film"]


def _tampered_artifact_eval(ws: Workspace) -> list[str]:
    from tests.helpers.artifacts import make_artifact

    artifact = make_artifact(ws.teacher, ws.root / "artifact", "onnx", [16], target="arm64-onnx")
    (artifact / "labels.json").write_text('["l1", "l0"]')
    return ["eval", str(artifact), "--data", str(ws.data["dev"]), "--text", "sentence"]


def _failed_gate(ws: Workspace) -> list[str]:
    extra = "targets: [arm64-onnx]\ngates: {min_accuracy: 1.0}\n"
    stages = FINETUNE + "  - type: export\n"
    return ws.run(ws.recipe(stages, extra))


# -- files compress wrote earlier: reports, device results, run folders, artifacts, bundles ----------


def _report_dict(**top: object) -> dict:
    """A minimal report.json as `compress run` writes it: a teacher, one artifact, absolute gates."""
    artifact = {
        "name": "02-export/arm64-onnx",
        "role": "artifact",
        "format": "onnx",
        "target": "arm64-onnx",
        "bytes": 1000,
        "sha256": "ab" * 32,
        "metrics": {"accuracy": 0.5, "latency_ms": {"p50": 1.0}},
        "measured": {"machine": "x86_64"},
    }
    teacher = {
        "name": "teacher",
        "role": "teacher",
        "format": "torch",
        "bytes": 4000,
        "metrics": {"accuracy": 0.9},
    }
    report = {
        "schema": "compress.report/1",
        "run": "runs/tiny",
        "teacher": teacher,
        "checkpoints": [],
        "artifacts": [artifact],
        "device_results": [],
        "gates_config": {"min_accuracy": 0.9},
        "gates": [],
    }
    report.update(top)
    return report


def _write_report(ws: Workspace, report: dict | str, name: str = "report.json") -> Path:
    path = ws.root / name
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    return path


def _gate(report: dict | str, *extra: str) -> Callable[[Workspace], list[str]]:
    return lambda ws: ["gate", str(_write_report(ws, report)), *extra]


def _metric_as_text() -> dict:
    report = _report_dict()
    report["artifacts"][0]["metrics"]["accuracy"] = "0.5"
    return report


def _nameless_artifact() -> dict:
    report = _report_dict()
    del report["artifacts"][0]["name"]
    return report


def _deep_report() -> str:
    return json.dumps(_report_dict())[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _gate_baseline_bytes_text(ws: Workspace) -> list[str]:
    baseline = _report_dict()
    baseline["artifacts"][0]["bytes"] = "1 kB"
    old = _write_report(ws, baseline, "old.json")
    return ["gate", str(_write_report(ws, _report_dict())), "--baseline", str(old)]


def _symlink_loop(ws: Workspace, name: str) -> Path:
    a, b = ws.root / name, ws.root / f"{name}.other"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _fifo(ws: Workspace, name: str) -> Path:
    path = ws.root / name
    os.mkfifo(path)
    return path


def _gate_report_loop(ws: Workspace) -> list[str]:
    return ["gate", str(_symlink_loop(ws, "report.json"))]


def _gate_report_fifo(ws: Workspace) -> list[str]:
    return ["gate", str(_fifo(ws, "report.json"))]


def _gate_junit(target: Callable[[Workspace], Path]) -> Callable[[Workspace], list[str]]:
    """A passing report and a --junit path that is not a regular file."""
    passing = _report_dict(gates_config={"min_accuracy": 0.1})
    return lambda ws: ["gate", str(_write_report(ws, passing)), "--junit", str(target(ws))]


def _link_to_dev_null(ws: Workspace) -> Path:
    """A link to /dev/null: the old code replaced the link (never /dev/null itself) with a file."""
    link = ws.root / "junit.xml"
    link.symlink_to("/dev/null")
    return link


def _run_folder(ws: Workspace, report: dict | None = None, run_json: str | None = None) -> Path:
    run = ws.root / "runs" / "tiny"
    run.mkdir(parents=True, exist_ok=True)
    if report is not None:
        (run / "report.json").write_text(json.dumps(report))
    (run / "run.json").write_text(
        run_json
        if run_json is not None
        else json.dumps(
            {
                "schema": "compress.run/1",
                "recipe": "tiny",
                "recipe_file": str(ws.recipe()),
                "teacher_dir": str(ws.teacher),
                "teacher_load": {},
                "stages": [{"index": 1, "type": "export", "dir": "01-export"}],
            }
        )
    )
    return run


def _report_truncated(ws: Workspace) -> list[str]:
    run = _run_folder(ws)
    (run / "report.json").write_text(json.dumps(_report_dict())[:200])
    return ["report", str(run)]


def _device_results(content: object) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        run = _run_folder(ws, _report_dict())
        path = ws.root / "device.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return ["report", str(run), "--device-results", str(path)]

    return build


DEVICE_ROW = {
    "schema": "compress.device-benchmark/1",
    "model_sha256": "ab" * 32,
    "device": {"machine": "aarch64"},
    "interpreter": {"name": "onnxruntime", "version": "1"},
    "latency_ms": "fast",
}


def _run_json(text: str) -> Callable[[Workspace], list[str]]:
    return lambda ws: ["report", str(_run_folder(ws, run_json=text))]


def _checkpoint_config(config: dict) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        folder = ws.root / "checkpoint"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return ["eval", str(folder), "--data", str(ws.data["dev"]), "--text", "sentence"]

    return build


def _artifact_manifest(manifest: dict) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        folder = ws.root / "artifact"
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        (folder / "labels.json").write_text('["l0", "l1"]')
        return ["eval", str(folder), "--data", str(ws.data["dev"]), "--text", "sentence"]

    return build


def _rehash(folder: Path) -> None:
    """Make the manifest agree with the files again, as a careless re-packer would."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["files"]:
        path = folder / entry["path"]
        if path.is_file():
            entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _onnx_artifact(ws: Workspace, target: str = "arm64-onnx", folder: Path | None = None) -> Path:
    from tests.helpers.artifacts import make_artifact

    return make_artifact(ws.teacher, folder or ws.root / "artifact", "onnx", [16], target=target)


def _corrupt_onnx(folder: Path) -> None:
    model = folder / "model.onnx"
    model.write_bytes(b"\x08\x07garbage, not a protobuf" * 64)
    _rehash(folder)


def _eval_corrupt_onnx(ws: Workspace) -> list[str]:
    folder = _onnx_artifact(ws)
    _corrupt_onnx(folder)
    return ["eval", str(folder), "--data", str(ws.data["dev"]), "--text", "sentence"]


def _runner(damage: Callable[[Workspace, Path], list[str] | None]) -> Callable[[Workspace], list[str]]:
    """The on-device runner on an artifact folder that ``damage`` changed; it may add arguments."""

    def build(ws: Workspace) -> list[str]:
        folder = _onnx_artifact(ws)
        extra = damage(ws, folder) or []
        ws.module = "compress.runtime.runner"
        return ["--dir", str(folder), "predict", "a good film", *extra]

    return build


def _runner_input(name: str, content: str) -> Callable[[Workspace], list[str]]:
    """The runner's ``predict --file`` on an input file with ``content``."""

    def build(ws: Workspace) -> list[str]:
        folder = _onnx_artifact(ws)
        (ws.root / name).write_text(content)
        ws.module = "compress.runtime.runner"
        return ["--dir", str(folder), "predict", "--file", str(ws.root / name)]

    return build


def _runner_newer_bundle(ws: Workspace, folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "schema": "compress.bundle/2"}))


def _runner_corrupt_onnx(ws: Workspace, folder: Path) -> None:
    _corrupt_onnx(folder)


def _runner_files_not_objects(ws: Workspace, folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = [entry["path"] for entry in manifest["files"]]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _runner_deep_manifest(ws: Workspace, folder: Path) -> None:
    text = (folder / "manifest.json").read_text().rstrip()
    (folder / "manifest.json").write_text(text[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _runner_duplicate_labels(ws: Workspace, folder: Path) -> None:
    (folder / "labels.json").write_text('["l0", "l0"]')
    _rehash(folder)


def _runner_corrupt_tokenizer(ws: Workspace, folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordPiece"')
    _rehash(folder)


def _runner_out_dev_null(ws: Workspace, folder: Path) -> list[str]:
    return ["--out", str(_link_to_dev_null(ws))]


def _bundle_run(ws: Workspace, damage: Callable[[Path], None] | None = None) -> Path:
    """A finished run folder with one export stage holding one ONNX artifact for arm64-onnx."""
    run = _run_folder(ws)
    stage = run / "01-export"
    stage.mkdir()
    manifest = {"schema": "compress.stage/1", "produces": "artifacts", "complete": True}
    (stage / "manifest.json").write_text(json.dumps(manifest))
    artifact = _onnx_artifact(ws, folder=stage / "arm64-onnx")
    if damage is not None:
        damage(artifact)
    return run


def _list_outside_file(artifact: Path, rel: str, content: bytes = b"secret\n") -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["files"].append(
        {"path": rel, "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    )
    (artifact / "manifest.json").write_text(json.dumps(manifest))


def _bundle_dotdot(ws: Workspace) -> list[str]:
    (ws.root / "secret.txt").write_bytes(b"secret\n")

    def damage(artifact: Path) -> None:
        _list_outside_file(artifact, "../../../../secret.txt")

    return ["bundle", str(_bundle_run(ws, damage)), "--target", "arm64-onnx"]


def _bundle_absolute(ws: Workspace) -> list[str]:
    secret = ws.root / "secret.txt"
    secret.write_bytes(b"secret\n")
    return [
        "bundle",
        str(_bundle_run(ws, lambda a: _list_outside_file(a, str(secret)))),
        "--target",
        "arm64-onnx",
    ]


def _bundle_symlink_out(ws: Workspace) -> list[str]:
    secret = ws.root / "secret.txt"
    secret.write_bytes(b"secret\n")

    def damage(artifact: Path) -> None:
        (artifact / "notes.txt").symlink_to(secret)
        _list_outside_file(artifact, "notes.txt")

    return ["bundle", str(_bundle_run(ws, damage)), "--target", "arm64-onnx"]


def _bundle_out_fifo(ws: Workspace) -> list[str]:
    run = _bundle_run(ws)
    return ["bundle", str(run), "--target", "arm64-onnx", "-o", str(_fifo(ws, "b.tar.gz"))]


def _eval_stage_dir_escape(ws: Workspace) -> list[str]:
    run_json = {
        "schema": "compress.run/1",
        "recipe_file": str(ws.recipe()),
        "teacher_dir": str(ws.teacher),
        "stages": [{"type": "export", "dir": "../../elsewhere"}],
    }
    run = _run_folder(ws, run_json=json.dumps(run_json))
    return ["eval", str(run), "--data", str(ws.data["dev"]), "--text", "sentence"]


def _verify_arm(damage: Callable[[Workspace, Path], Path]) -> Callable[[Workspace], list[str]]:
    """``compress verify-arm`` on a bundle that ``damage`` changed; the bundle is checked before qemu."""

    def build(ws: Workspace) -> list[str]:
        from compress.bundle import bundle_files, write_tar

        files = bundle_files(_onnx_artifact(ws), 1, "b.tar.gz")
        bundle = ws.root / "b.tar.gz"
        write_tar(bundle, "b", files, 0)
        texts = ws.root / "texts.txt"
        texts.write_text("a good film\n")
        return ["verify-arm", str(damage(ws, bundle)), "--data", str(texts), "--cache", str(ws.root / "root")]

    return build


def _truncated_bundle(ws: Workspace, bundle: Path) -> Path:
    bundle.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
    return bundle


def _fifo_bundle(ws: Workspace, bundle: Path) -> Path:
    bundle.unlink()
    return _fifo(ws, "b.tar.gz")


def _bundle_listing_outside(ws: Workspace, bundle: Path) -> Path:
    """A re-packed bundle whose manifest lists a file above the bundle folder."""
    import tarfile as tar_module

    from compress.bundle import write_tar

    with tar_module.open(bundle) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    manifest = json.loads(files["manifest.json"])
    manifest["files"].append({"path": "../outside.txt", "sha256": "ab" * 32, "bytes": 1})
    files["manifest.json"] = json.dumps(manifest).encode()
    write_tar(bundle, "b", files, 0)
    return bundle


# -- recipes that validate but cannot run -----------------------------------------------------------


def _validate(stages: str = FINETUNE, extra: str = "", **edits: tuple[str, str]):
    def build(ws: Workspace) -> list[str]:
        path = ws.recipe(stages, extra)
        for old, new in edits.values():
            ws.edit(path, old, new)
        return ["validate", str(path)]

    return build


def _validate_long_target(ws: Workspace) -> list[str]:
    _own_targets(ws, TINY_BOARD.replace("sequence_lengths: [16]", "sequence_lengths: [16, 256]"))
    return ["validate", str(ws.recipe(FINETUNE, "targets: [tiny-board]\n"))]


def _recipe_fifo(ws: Workspace) -> list[str]:
    return ["validate", str(_fifo(ws, "r.yaml"))]


def _recipe_loop(ws: Workspace) -> list[str]:
    return ["validate", str(_symlink_loop(ws, "r.yaml"))]


def _data_special(make: Callable[[Workspace, str], Path]) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        path = ws.edit(ws.recipe(), str(ws.data["dev"]), str(make(ws, "dev.tsv")))
        return ws.run(path)

    return build


def _profile_fifo(ws: Workspace) -> list[str]:
    folder = ws.root / "targets"
    folder.mkdir()
    os.mkfifo(folder / "tiny-board.yaml")
    ws.env["COMPRESS_TARGETS"] = str(folder)
    return ["targets"]


def _eval_data_fifo(ws: Workspace) -> list[str]:
    folder = ws.root / "checkpoint"
    shutil.copytree(ws.teacher, folder)
    return ["eval", str(folder), "--data", str(_fifo(ws, "dev.tsv")), "--text", "sentence"]


def _rows(label: str, n: int = 8) -> str:
    return "sentence\tlabel\n" + f"good film\t{label}\nbad film\t0\n" * n


CASES = [
    # YAML and the recipe file itself
    Case("yaml-unclosed-bracket", _yaml("name: x\nstages: [\n"), ("malformed yaml", "r.yaml:3", "fix")),
    Case(
        "yaml-tab-indent", _edited("  - type: finetune", "\t- type: finetune"), ("malformed yaml", "r.yaml:")
    ),
    Case("yaml-not-a-mapping", _yaml("- finetune\n- distill\n"), ("must be a mapping",)),
    Case("yaml-empty-file", _yaml(""), ("recipe is empty", "start from")),
    Case("yaml-duplicate-key", _edited("seed: 0", "seed: 0\nseed: 1"), ("duplicate key 'seed'", "r.yaml:3")),
    Case("yaml-python-tag", _python_tag, ("python/object/apply", "r.yaml:1")),
    Case("recipe-missing", lambda ws: ws.run(ws.root / "nope.yaml"), ("nope.yaml", "not found")),
    Case("recipe-is-a-folder", _recipe_folder, ("folder.yaml", "is a folder")),
    Case("recipe-not-utf8", _recipe_latin1, ("not utf-8", "save it as utf-8")),
    # keys and types
    Case(
        "unknown-key",
        _edited("seed: 0", "seed: 0\nepoch: 3"),
        ("r.yaml:3", "epoch", "unknown key", "spelling"),
    ),
    Case(
        "unknown-stage-key",
        _edited("epochs: 1", "epochs: 1\n    learning_rate: 3"),
        ("stages[0].learning_rate", "unknown key"),
    ),
    Case("unknown-stage-type", _edited("type: finetune", "type: prune"), ("'prune'", "known types")),
    Case("stage-without-type", _edited("type: finetune", "kind: finetune"), ("stages[0]", "type: ")),
    Case(
        "no-stages",
        _edited("stages:\n  - type: finetune\n    epochs: 1\n", "stages: []\n"),
        ("stages", "at least 1"),
    ),
    Case(
        "stages-not-a-list", _edited("  - type: finetune\n    epochs: 1\n", "  type: finetune\n"), ("stages",)
    ),
    Case(
        "epochs-not-a-number", _edited("epochs: 1", "epochs: many"), ("stages[0].epochs", "integer", "'many'")
    ),
    Case(
        "epochs-yes",
        _edited("epochs: 1", "epochs: yes"),
        ("stages[0].epochs", "integer"),
    ),
    Case("lr-not-a-number", _edited("epochs: 1", "epochs: 1\n    lr: fast"), ("stages[0].lr", "number")),
    Case(
        "labels-not-a-list",
        _edited("labels: [negative, positive]", "labels: negative"),
        ("task.labels", "list"),
    ),
    Case("seed-fraction", _edited("seed: 0", "seed: 1.5"), ("seed", "integer", "1.5")),
    Case(
        "name-escapes-run-folder",
        _edited("name: tiny", "name: ../escape"),
        ("name", "'../escape'", "letters"),
    ),
    Case("name-absolute", _edited("name: tiny", "name: /tmp/escape"), ("name", "'/tmp/escape'")),
    # numbers out of range
    Case("epochs-zero", _edited("epochs: 1", "epochs: 0"), ("r.yaml:11", "stages[0].epochs", "> 0", "got 0")),
    Case("epochs-negative", _stages(DISTILL.replace("epochs: 1", "epochs: -2")), ("stages[0].epochs", "-2")),
    Case("layers-zero", _stages(DISTILL.replace("layers: 1", "layers: 0")), ("stages[0].layers", "> 0")),
    Case("temperature-zero", _stages(DISTILL + "    temperature: 0\n"), ("stages[0].temperature", "> 0")),
    Case("temperature-negative", _stages(DISTILL + "    temperature: -1.5\n"), ("temperature", "-1.5")),
    Case(
        "batch-size-zero",
        _edited("epochs: 1", "epochs: 1\n    batch_size: 0"),
        ("stages[0].batch_size", "> 0"),
    ),
    Case(
        "batch-size-negative-in-recovery",
        _stages("  - type: share\n    embedding_rank: 8\n    recovery: {batch_size: -8}\n"),
        ("stages[0].recovery.batch_size", "-8"),
    ),
    Case("max-length-zero", _edited("max_length: 16", "max_length: 0"), ("task.max_length", "> 0")),
    Case("share-nothing-to-do", _stages(SHARE), ("stages[0]", "at least one of layers")),
    Case(
        "positions-shorter-than-max-length",
        _stages(SHARE + "    positions: 8\n"),
        ("stages[0].positions", "task.max_length (16 tokens)", "keep at least 16"),
    ),
    Case(
        "positions-shorter-than-a-target",
        _stages(SHARE + "    positions: 16\n", "targets: [arm64-onnx]\n"),
        ("stages[0].positions", "target arm64-onnx (128 tokens)", "keep at least 128", "target_options"),
    ),
    Case(
        "target-options-for-an-unlisted-target",
        _stages(SHARE + "    positions: 16\n", "target_options: {arm64-onnx: {sequence_lengths: [16]}}\n"),
        ("target_options", "'arm64-onnx' is not in targets", "add it to targets"),
    ),
    Case(
        "target-options-extend-a-profile",
        _stages(
            DISTILL,
            "targets: [raspberry-pi-4]\ntarget_options: {raspberry-pi-4: {sequence_lengths: [32, 256]}}\n",
        ),
        ("target_options.raspberry-pi-4.sequence_lengths", "256", "1..128", "never extend"),
    ),
    Case(
        "target-options-empty-lengths",
        _stages(
            DISTILL, "targets: [raspberry-pi-4]\ntarget_options: {raspberry-pi-4: {sequence_lengths: []}}\n"
        ),
        ("target_options.raspberry-pi-4.sequence_lengths",),
    ),
    # model structure (known once the teacher is loaded)
    Case(
        "more-student-layers-than-teacher",
        _stages(DISTILL.replace("layers: 1", "layers: 5")),
        ("r.yaml", "stages[0].layers", "teacher's 2 layers", "1..2"),
    ),
    Case("init-layer-out-of-range", _stages(DISTILL + "    init: [7]\n"), ("stages[0].init", "[7]", "0..1")),
    Case(
        "hidden-layer-map-out-of-range",
        _stages(DISTILL + "    weights: {soft: 1, hidden: 1}\n    hidden: {layer_map: [[1, 9]]}\n"),
        ("layer_map", "[1, 9]", "0..2"),
    ),
    Case(
        "sharing-groups-overlap",
        _stages(SHARE + "    layers: {mode: groups, groups: [[0, 1], [1, 0]]}\n"),
        ("r.yaml", "groups", "one group only"),
    ),
    Case(
        "sharing-group-out-of-range",
        _stages(SHARE + "    layers: {mode: groups, groups: [[0, 5]]}\n"),
        ("r.yaml", "groups[0]", "layer 5", "0..1"),
    ),
    Case(
        "embedding-rank-above-hidden",
        _stages(SHARE + "    embedding_rank: 64\n"),
        ("r.yaml", "embedding_rank", "hidden size 32"),
    ),
    # teacher folders
    Case(
        "teacher-two-sources",
        _edited("teacher: {path: ", "teacher: {hub: bert-base-uncased, path: "),
        ("teacher", "exactly one of path, hub or package"),
    ),
    Case(
        "teacher-missing",
        lambda ws: ws.run(ws.edit(ws.recipe(), str(ws.teacher), str(ws.root / "gone"))),
        ("teacher.path", "folder not found"),
    ),
    Case("teacher-without-weights", _teacher(_no_weights), ("no model weights", "model.safetensors")),
    Case("teacher-truncated-safetensors", _teacher(_truncate), ("model.safetensors", "truncated", "re-save")),
    Case("teacher-garbage-safetensors", _teacher(_garbage), ("model.safetensors", "corrupted")),
    Case("teacher-pickle-only", _teacher(_pickle_only), ("pickle", "allow_pickle: true")),
    Case("teacher-config-corrupt", _teacher(_bad_config), ("config.json",)),
    # data files
    Case(
        "data-missing",
        lambda ws: ws.run(ws.edit(ws.recipe(), str(ws.data["dev"]), str(ws.root / "gone.tsv"))),
        ("data.eval.path", "file not found"),
    ),
    Case("data-is-a-folder", _data_folder, ("data.eval.path", "folder")),
    Case("data-empty", _data("empty.tsv", ""), ("empty.tsv", "no data rows")),
    Case("data-header-only", _data("head.tsv", "sentence\tlabel\n"), ("head.tsv", "no data rows")),
    Case(
        "data-missing-column",
        _data("cols.tsv", "text\tlabel\nhello\t1\n"),
        ("cols.tsv", "missing column 'sentence'", "task.text"),
    ),
    Case(
        "data-label-not-in-task-labels",
        _data("lab.tsv", "sentence\tlabel\nhello\tneutral\n", "eval"),
        ("lab.tsv", "'neutral'", "task.labels"),
    ),
    Case(
        "data-label-id-out-of-range",
        _data("lab.tsv", "sentence\tlabel\nhello\t7\n", "eval"),
        ("lab.tsv", "label 7", "0..1"),
    ),
    Case(
        "data-non-numeric-labels",
        _data("words.tsv", "sentence\tlabel\nhello\tpos\nbye\tneg\n", x=NO_TASK_LABELS),
        ("words.tsv", "not integers", "task.labels"),
    ),
    Case(
        "data-labels-beyond-teacher",
        _data(
            "three.tsv",
            _three_labels(),
            stages=DISTILL + "    weights: {soft: 1, hard: 1}\n",
            x=NO_TASK_LABELS,
        ),
        ("three.tsv", "teacher", "labels"),
    ),
    Case("data-not-utf8", _data("latin.tsv", b"sentence\tlabel\ncaf\xe9\t1\n"), ("latin.tsv", "utf-8")),
    Case(
        "data-bad-jsonl",
        _data("rows.jsonl", '{"sentence": "ok", "label": 1}\n{"sentence": \n'),
        ("rows.jsonl:2", "json"),
    ),
    Case(
        "data-empty-text", _data("blank.tsv", "sentence\tlabel\n \t1\n"), ("blank.tsv", "row 1", "empty text")
    ),
    # targets and quantization
    Case(
        "target-unknown",
        _stages(FINETUNE, "targets: [raspberry-pi-9]\n"),
        ("'raspberry-pi-9'", "known targets"),
    ),
    Case("target-twice", _stages(FINETUNE, "targets: [arm64-onnx, arm64-onnx]\n"), ("targets", "twice")),
    Case("scheme-not-allowed-by-target", _static_on_dynamic_only, ("tiny-board", "static", "dynamic")),
    Case("target-profile-invalid", _broken_profile, ("tiny-board.yaml", "threads", "> 0")),
    Case("target-profile-misnamed", _misnamed_profile, ("pi.yaml", "must match the file name")),
    # overrides
    Case("override-unknown-path", _override("stages.4.epochs=2"), ("--set", "does not exist")),
    Case("override-without-value", _override("stages.0.epochs"), ("--set", "key=value")),
    # the machine
    Case("out-under-a-file", _out_under_file, ("a-file/runs", "--out")),
    Case("out-in-proc", _out_in_proc, ("/proc/compress-runs", "--out")),
    Case("file-size-limit", _file_size_limit, ("01-finetune", "too large", "--out")),
    Case("disk-full", _full_disk, ("no space left", "--out")),
    Case("run-folder-locked", _locked, ("another compress process", "pid ", "--out")),
    Case("bundle-model-tampered", _tampered_bundle, ("model.onnx", "sha256", "copy it again")),
    Case("artifact-tampered-before-eval", _tampered_artifact_eval, ("labels.json", "sha256")),
    Case("gate-fails", _failed_gate, ("min_accuracy",), code=1),
    # files compress wrote earlier (issue 20): wrong types, missing keys, nesting, newer versions
    Case("gate-metric-as-text", _gate(_metric_as_text()), ("artifacts[0].metrics.accuracy", "'0.5'")),
    Case("gate-artifact-without-name", _gate(_nameless_artifact()), ("artifacts[0].name", "missing")),
    Case("gate-report-deeply-nested", _gate(_deep_report()), ("report.json", "nested deeper")),
    Case(
        "gate-report-from-a-newer-compress",
        _gate(_report_dict(gates_config={"min_accuracy": 0.9, "max_energy_mj": 3.0})),
        ("min_accuracy", "02-export/arm64-onnx"),
        code=1,
    ),
    Case("gate-baseline-bytes-as-text", _gate_baseline_bytes_text, ("old.json", "artifacts[0].bytes")),
    Case("gate-report-symlink-loop", _gate_report_loop, ("report.json", "symbolic link loop")),
    Case("gate-report-is-a-fifo", _gate_report_fifo, ("report.json", "fifo", "save the content to a file")),
    Case("gate-junit-link-to-dev-null", _gate_junit(_link_to_dev_null), ("junit.xml", "character device")),
    Case("gate-junit-is-a-folder", _gate_junit(lambda ws: ws.root), ("is a folder", "file path")),
    Case("report-json-truncated", _report_truncated, ("report.json", "not valid json", "delete it")),
    Case(
        "device-results-wrong-type",
        _device_results(DEVICE_ROW),
        ("device.json", "latency_ms", "runner.py benchmark"),
    ),
    Case(
        "device-results-not-objects", _device_results([3]), ("device.json", "schema", "runner.py benchmark")
    ),
    Case("device-results-empty-list", _device_results([]), ("device.json", "empty", "runner.py benchmark")),
    Case(
        "run-json-truncated", _run_json('{"schema": "compress.run/1", "stag'), ("run.json", "not valid json")
    ),
    Case(
        "run-json-wrong-types",
        _run_json('{"recipe_file": 5, "stages": "all"}'),
        ("run.json", "recipe_file", "--fresh"),
    ),
    Case("run-json-stage-dir-escapes", _eval_stage_dir_escape, ("run.json", "stages[0].dir")),
    Case(
        "checkpoint-id2label-not-ids",
        _checkpoint_config({"model_type": "bert", "id2label": {"zero": "neg", "one": "pos"}}),
        ("config.json", "id2label", "save_pretrained"),
    ),
    Case(
        "artifact-manifest-without-format",
        _artifact_manifest({"kind": "artifact", "files": []}),
        ("manifest.json", "format", "export the artifact again"),
    ),
    # model files
    Case("eval-corrupt-onnx", _eval_corrupt_onnx, ("model.onnx", "cannot load it", "copy the bundle again")),
    Case("runner-corrupt-onnx", _runner(_runner_corrupt_onnx), ("model.onnx", "cannot load it")),
    Case("runner-manifest-files-not-objects", _runner(_runner_files_not_objects), ("files[0]", "re-create")),
    Case("runner-manifest-deeply-nested", _runner(_runner_deep_manifest), ("manifest.json", "nested")),
    Case(
        "runner-input-jsonl-deeply-nested",
        _runner_input("in.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
        ("in.jsonl:1", "json object"),
    ),
    Case(
        "runner-bundle-from-a-newer-major-version",
        _runner(_runner_newer_bundle),
        ("compress.bundle/2", "the runner.py inside that bundle"),
    ),
    Case("runner-corrupt-tokenizer", _runner(_runner_corrupt_tokenizer), ("tokenizer.json", "cannot load")),
    Case(
        "runner-negative-threads",
        lambda ws: ["--threads", "-2", *_runner(lambda ws, folder: None)(ws)],
        ("--threads -2", "positive"),
    ),
    Case("runner-duplicate-labels", _runner(_runner_duplicate_labels), ("labels.json", "twice")),
    Case("runner-out-link-to-dev-null", _runner(_runner_out_dev_null), ("junit.xml", "fifo or device")),
    # bundle paths stay inside the artifact folder
    Case("bundle-manifest-path-climbs-out", _bundle_dotdot, ("manifest.json", "leaves its folder")),
    Case("bundle-manifest-absolute-path", _bundle_absolute, ("manifest.json", "leaves its folder")),
    Case("bundle-manifest-symlink-out", _bundle_symlink_out, ("notes.txt", "links outside")),
    Case(
        "bundle-run-symlink-loop",
        lambda ws: ["bundle", str(_symlink_loop(ws, "run")), "--target", "arm64-onnx"],
        ("run", "symbolic link loop"),
    ),
    Case("bundle-out-is-a-fifo", _bundle_out_fifo, ("b.tar.gz", "fifo", "file path")),
    Case(
        "verify-arm-truncated-bundle",
        _verify_arm(_truncated_bundle),
        ("b.tar.gz", "not a readable bundle", "copy it again"),
    ),
    Case("verify-arm-bundle-is-a-fifo", _verify_arm(_fifo_bundle), ("b.tar.gz", "fifo")),
    Case(
        "verify-arm-manifest-path-climbs-out",
        _verify_arm(_bundle_listing_outside),
        ("b.tar.gz", "'../outside.txt'", "leaves the folder"),
    ),
    # label columns
    Case(
        "data-label-superscript-digit",
        _data("sup.tsv", _rows("\u00b2"), x=NO_TASK_LABELS),
        ("sup.tsv", "not integers", "task.labels"),
    ),
    Case(
        "data-label-arabic-digit",
        _data("arabic.tsv", _rows("\u0661"), x=NO_TASK_LABELS),
        ("arabic.tsv", "not integers", "task.labels"),
    ),
    Case(
        "data-label-id-too-large",
        _data("huge.tsv", _rows("20000"), x=NO_TASK_LABELS),
        ("huge.tsv", "label id 20000", "renumber"),
    ),
    Case(
        "data-label-json-true",
        _data("rows.jsonl", '{"sentence": "good film", "label": true}\n{"sentence": "bad", "label": 0}\n'),
        ("rows.jsonl", "'true'", "task.labels"),
    ),
    Case(
        "data-csv-byte-order-mark",
        _data("bom.csv", "\ufeffsentence,label\nhello,7\n", "eval"),
        ("bom.csv", "label 7", "0..1"),
    ),
    Case(
        "data-jsonl-deeply-nested",
        _data("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
        ("deep.jsonl:1", "nested too deeply"),
    ),
    Case(
        "data-jsonl-huge-integer",
        _data("big.jsonl", '{"sentence": "a", "label": ' + "1" * 5000 + "}\n"),
        ("big.jsonl:1", "fix the line"),
    ),
    # validate: everything that can be known before training
    Case(
        "validate-temperature-infinite",
        _validate(DISTILL + "    temperature: .inf\n"),
        ("stages[0].temperature", "finite"),
    ),
    Case("validate-lr-nan", _validate(FINETUNE + "    lr: .nan\n"), ("stages[0].lr", "finite")),
    Case("validate-seed-above-numpy", _validate(x=("seed: 0", "seed: 4294967296")), ("seed", "<=")),
    Case("validate-seed-negative", _validate(x=("seed: 0", "seed: -1")), ("seed", ">= 0")),
    Case(
        "validate-duplicate-label-names",
        _validate(x=("labels: [negative, positive]", "labels: [negative, negative]")),
        ("task.labels", "'negative' is listed twice"),
    ),
    Case(
        "validate-max-length-beyond-teacher",
        _validate(x=("max_length: 16", "max_length: 512")),
        ("task.max_length", "position table (128 tokens", "at most 128"),
    ),
    Case(
        "validate-reads-the-data",
        lambda ws: (ws.data_file("lab.tsv", "sentence\tlabel\nhello\tneutral\n", "eval"), _validate()(ws))[1],
        ("lab.tsv", "'neutral'", "task.labels"),
    ),
    Case("validate-target-beyond-teacher", _validate_long_target, ("tiny-board", "256", "target_options")),
    Case("recipe-is-a-fifo", _recipe_fifo, ("r.yaml", "fifo", "save the recipe")),
    Case("recipe-symlink-loop", _recipe_loop, ("r.yaml", "symbolic link loop")),
    Case("data-path-is-a-fifo", _data_special(_fifo), ("data.eval.path", "fifo")),
    Case("data-path-symlink-loop", _data_special(_symlink_loop), ("data.eval.path", "symbolic link loop")),
    Case("target-profile-is-a-fifo", _profile_fifo, ("tiny-board.yaml", "fifo")),
    Case(
        "eval-json-is-a-folder",
        lambda ws: [
            "eval",
            str(ws.teacher),
            "--data",
            str(ws.data["dev"]),
            "--text",
            "sentence",
            "--json",
            str(ws.root),
        ],
        ("is a folder", "give a file path"),
    ),
    Case("eval-data-is-a-fifo", _eval_data_fifo, ("dev.tsv", "fifo", "save the data to a file")),
]


def _cases():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=marks)


def _tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")} if root.exists() else set()


def _half_written(path: Path, out: Path) -> bool:
    """A path in a stage folder (``NN-<stage>``) whose manifest does not say it is complete."""
    from compress.io import read_json

    rel = path.relative_to(out)
    if len(rel.parts) < 2 or not re.match(r"\d\d-", rel.parts[1]):
        return False
    manifest = out / rel.parts[0] / rel.parts[1] / "manifest.json"
    return not (manifest.is_file() and read_json(manifest).get("complete") is True)


@pytest.fixture
def workspace(tmp_path: Path, tiny_bert_dir: Path, reviews: dict[str, Path]):
    ws = Workspace(tmp_path, tiny_bert_dir, reviews, tmp_path / "runs", {**os.environ, "HF_HUB_OFFLINE": "1"})
    yield ws
    for cleanup in ws.cleanups:
        cleanup()


@pytest.mark.parametrize("case", list(_cases()))
def test_bad_input_fails_cleanly(case: Case, workspace: Workspace):
    args = case.build(workspace)
    before = _tree(workspace.root)
    done = subprocess.run(
        [sys.executable, "-m", workspace.module, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workspace.root,
        env=workspace.env,
        preexec_fn=workspace.preexec,
    )
    stderr = done.stderr
    assert done.returncode == case.code, f"exit {done.returncode}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    prefix = "gate failed:" if case.code == 1 else "error:"
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(prefix)]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr[-3000:]
    if not any(line.startswith("compress: ") for line in lines):
        assert lines == errors, f"a failure before the run starts prints only its error line:\n{stderr}"
    for part in case.expect:
        assert part.lower() in errors[0].lower(), f"{part!r} not in: {errors[0]}"
    assert not (workspace.root / "PWNED").exists()
    new = _tree(workspace.root) - before
    assert not [p for p in new if ".tmp" in str(p)], sorted(new)
    if workspace.out.is_relative_to(workspace.root) and workspace.out.exists():
        out = workspace.out.relative_to(workspace.root)
        half = [p for p in new if p.is_relative_to(out) and _half_written(workspace.root / p, workspace.out)]
        assert not half, f"left behind: {sorted(map(str, half))}"


def test_catalogue_is_complete():
    assert len(CASES) >= 120 and len({case.id for case in CASES}) == len(CASES)
