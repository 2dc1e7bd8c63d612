"""verify-arm's host-side parts; the emulated run needs Debian's mirror and PyPI, so no unit test runs it."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from compress import arm
from compress.cli_deploy import verify_arm_cmd
from compress.errors import CompressError


def test_missing_emulator_prints_the_install_command(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(arm.shutil, "which", lambda tool: None if tool == "qemu-aarch64-static" else "/bin/x")
    with pytest.raises(
        CompressError, match=r"qemu-aarch64-static; .*apt-get install -y qemu-user-static debootstrap"
    ):
        arm.check_tools()


def test_compare_counts_label_agreement_and_logit_drift():
    host = [{"label": "a", "logits": [1.0, 0.0]}, {"label": "b", "logits": [0.0, 1.0]}]
    emulated = [{"label": "a", "logits": [1.0, 0.0]}, {"label": "a", "logits": [0.0, 0.0]}]
    assert arm.compare(host, emulated) == {
        "agree": 1,
        "total": 2,
        "near_ties": 0,
        "max_abs_logit_diff": 1.0,
        "differing_lines": [2],
        "host_margins": {"2": 1.0},
    }


def test_a_tarball_without_a_runner_is_not_a_bundle(tmp_path: Path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "model.tflite").write_bytes(b"x")
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "x", arcname="x")
    with pytest.raises(CompressError, match=r"expected one folder with runner\.py"):
        arm.unpack(tmp_path / "b.tar.gz", tmp_path / "out")


def test_verify_arm_needs_texts_to_compare_on(tmp_path: Path):
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"")
    result = CliRunner().invoke(verify_arm_cmd, [str(bundle)])
    assert result.exit_code != 0
    assert "--run RUN (its eval split) or --data FILE" in str(result.exception)


def test_compare_counts_only_close_calls_as_near_ties():
    from compress.arm import compare

    host = [
        {"label": "pos", "logits": [0.0, 0.1]},  # margin 0.1: a near tie
        {"label": "pos", "logits": [0.0, 2.0]},  # margin 2.0: a real disagreement
        {"label": "neg", "logits": [1.0, 0.0]},
    ]
    arm = [{"label": "neg", "logits": [0.1, 0.0]}, {"label": "neg", "logits": [2.0, 0.0]}, host[2]]
    strict = compare(host, arm)
    assert strict["agree"] == 1 and strict["near_ties"] == 0 and strict["differing_lines"] == [1, 2]
    loose = compare(host, arm, tie_margin=0.5)
    assert loose["near_ties"] == 1 and loose["host_margins"] == {"1": 0.1, "2": 2.0}


def test_min_agreement_tolerates_a_share_of_flipped_labels_but_not_a_missing_row():
    run = {"agree": 248, "near_ties": 0, "total": 250}
    assert not arm.run_passes(run, 250)  # default: every label as on the host
    assert arm.run_passes(run, 250, min_agreement=0.99)  # 2 of 250 = 0.8% may differ
    assert not arm.run_passes({**run, "agree": 247}, 250, min_agreement=0.99)
    assert arm.run_passes({**run, "agree": 247, "near_ties": 1}, 250, min_agreement=0.99)
    assert not arm.run_passes({"error": "crashed"}, 250, min_agreement=0.0)


def test_the_host_predicts_with_every_model_an_emulated_interpreter_may_pick(tiny_bert_dir, tmp_path):
    from compress.runtime.runner import load
    from tests.helpers.artifacts import make_artifact
    from tests.helpers.fallbacks import FALLBACK, with_fallback

    artifact = make_artifact(tiny_bert_dir, tmp_path / "tflite", "tflite", [16])
    folder = with_fallback(artifact, tmp_path / "pi")
    host = arm.host_predictions(
        tmp_path / "b.tar.gz", folder, load(folder), ["good phone", "bad staff"], None
    )
    assert list(host) == ["model.tflite", FALLBACK]
    assert all(
        len(h["rows"]) == 2 and {"label", "score", "logits"} <= set(h["rows"][0]) for h in host.values()
    )


def passing_result(bundle: Path, ok: bool = True) -> dict:
    runs = [
        {"requirements": "requirements.txt", "interpreter": {"name": "ai_edge_litert", "version": "2.3.0"},
         "machine": "aarch64", "model": "model.tflite", "model_sha256": "a" * 64, "agree": 250,
         "near_ties": 0, "total": 250},
        {"requirements": "requirements-tflite-runtime.txt",
         "interpreter": {"name": "tflite_runtime", "version": "2.14.0"}, "machine": "aarch64",
         "model": "fallback-weight-only.tflite", "model_sha256": "b" * 64, "agree": 249, "near_ties": 0,
         "total": 250},
    ]  # fmt: skip
    return {
        "bundle": str(bundle), "bundle_sha256": "c" * 64, "artifact": "04-quantize/raspberry-pi-4-int8",
        "runs": runs, "ok": ok,
        "models": {"model.tflite": {"ops": [{"op": "FULLY_CONNECTED", "version": 9}]},
                   "fallback-weight-only.tflite": {"ops": [{"op": "DEQUANTIZE", "version": 4}]}},
        "emulator": {"qemu_cpu": "cortex-a72", "debian": "bookworm", "root": "/cache/root"},
        "min_agreement": 0.99, "tie_margin": 0.0,
    }  # fmt: skip


def test_a_pass_records_which_interpreter_versions_loaded_which_model_and_a_failure_removes_it(tmp_path):
    from compress.io import read_json

    bundle = tmp_path / "pi.tar.gz"
    bundle.write_bytes(b"bundle bytes")
    path = arm.write_verification(bundle, passing_result(bundle))
    assert path == tmp_path / "pi.tar.gz.verified.json"
    record = read_json(path)
    assert (
        record["schema"] == "compress.verification/1" and record["bundle_sha256"] == "c" * 64
    )  # hashed before unpacking
    primary, fallback = record["models"]["model.tflite"], record["models"]["fallback-weight-only.tflite"]
    assert [(v["interpreter"], v["version"]) for v in primary["verified"]] == [("ai_edge_litert", "2.3.0")]
    assert [(v["interpreter"], v["version"]) for v in fallback["verified"]] == [("tflite_runtime", "2.14.0")]
    assert fallback["sha256"] == "b" * 64 and fallback["ops"] == [{"op": "DEQUANTIZE", "version": 4}]
    assert "root" not in record["emulator"]
    assert arm.write_verification(bundle, passing_result(bundle, ok=False)) is None
    assert not path.exists()


def test_host_predictions_load_each_model_by_its_path_in_the_folder(monkeypatch, tmp_path):
    import numpy as np

    import compress.runtime.runner as runner_module

    loaded = []

    class Fake:
        def __init__(self, model):
            self.model = model

        def predict_logits(self, texts, pairs):
            return np.zeros((len(texts), 2))

        def decode(self, logits):
            return [{"label": "neg", "score": 0.5} for _ in logits]

        def describe(self):
            return {"model_sha256": self.model}

    def fake_load(folder, *, verify=True, threads=None, model=None):
        loaded.append((model, verify))
        return Fake(model)

    monkeypatch.setattr(runner_module, "load", fake_load)
    picked = Fake("x")  # the host's own pick (a fallback here): not what keys the predictions
    picked.model = tmp_path / "sub" / "fb.tflite"
    picked.manifest = {"format": "tflite", "fallbacks": [{"path": "sub/fb.tflite"}]}
    host = arm.host_predictions(tmp_path / "b.tar.gz", tmp_path, picked, ["a", "b"], None)
    assert list(host) == ["model.tflite", "sub/fb.tflite"]
    assert loaded == [("model.tflite", False), ("sub/fb.tflite", False)]
    assert host["sub/fb.tflite"]["sha256"] == "sub/fb.tflite" and len(host["model.tflite"]["rows"]) == 2


def test_verify_arm_hashes_the_bundle_before_unpacking_it(monkeypatch, tmp_path):
    calls = []
    hash_bundle, unpack = arm.bundle_sha256, arm.unpack

    def hashed(bundle):
        calls.append("hash")
        return hash_bundle(bundle)

    def unpacked(bundle, into):
        calls.append("unpack")
        return unpack(bundle, into)

    monkeypatch.setattr(arm, "bundle_sha256", hashed)
    monkeypatch.setattr(arm, "unpack", unpacked)
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"not a tarball")
    with pytest.raises(CompressError, match="not a readable bundle"):
        arm.verify_arm(bundle, ["a"])
    assert calls == ["hash", "unpack"]


def test_a_failed_verify_arm_removes_an_earlier_record_before_any_work(tmp_path):
    bundle, texts = tmp_path / "pi.tar.gz", tmp_path / "texts.txt"
    bundle.write_bytes(b"not a tarball")
    texts.write_text("good phone\n")
    record = arm.record_path(bundle)
    record.write_text("{}")
    result = CliRunner().invoke(verify_arm_cmd, [str(bundle), "--data", str(texts)])
    assert result.exit_code != 0 and "not a readable bundle" in str(result.exception)
    assert not record.exists()
    record.write_text("{}")  # also when the command fails before reading the bundle
    result = CliRunner().invoke(verify_arm_cmd, [str(bundle)])
    assert result.exit_code != 0 and not record.exists()


def test_min_agreement_comes_from_the_tolerable_loss_the_quantize_stages_ran_with(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import compress.subjects
    from compress.cli_deploy import recipe_min_agreement
    from compress.io import write_json_atomic

    stages = [{"type": "distill", "dir": "01-distill"}, {"type": "quantize", "dir": "02-quantize"},
              {"type": "quantize", "dir": "03-quantize"}]  # fmt: skip
    write_json_atomic(tmp_path / "run.json", {"schema": "compress.run/1", "stages": stages})
    for folder, loss in (("01-distill", 0.5), ("02-quantize", 0.02), ("03-quantize", 0.01)):
        (tmp_path / folder).mkdir()
        write_json_atomic(
            tmp_path / folder / "manifest.json",
            {"schema": "compress.stage/1", "complete": True, "info": {"tolerable_loss": loss}},
        )
    recipe = SimpleNamespace(stages=[SimpleNamespace(type="quantize", tolerable_loss=0.2)])
    monkeypatch.setattr(compress.subjects, "recipe_of_run", lambda run_dir: recipe)  # edited since the run
    assert recipe_min_agreement(tmp_path) == 0.99
    for folder in ("02-quantize", "03-quantize"):  # a run whose stages recorded none: the recipe's
        write_json_atomic(tmp_path / folder / "manifest.json", {"schema": "compress.stage/1", "info": {}})
    assert recipe_min_agreement(tmp_path) == 0.8
    write_json_atomic(tmp_path / "03-quantize" / "manifest.json", {"info": {"tolerable_loss": "1%"}})
    with pytest.raises(CompressError, match=r"03-quantize/manifest\.json: info\.tolerable_loss must be"):
        recipe_min_agreement(tmp_path)
