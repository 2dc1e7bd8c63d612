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
        "bundle": str(bundle), "artifact": "04-quantize/raspberry-pi-4-int8", "runs": runs, "ok": ok,
        "models": {"model.tflite": {"ops": [{"op": "FULLY_CONNECTED", "version": 9}]},
                   "fallback-weight-only.tflite": {"ops": [{"op": "DEQUANTIZE", "version": 4}]}},
        "emulator": {"qemu_cpu": "cortex-a72", "debian": "bookworm", "root": "/cache/root"},
        "min_agreement": 0.99, "tie_margin": 0.0,
    }  # fmt: skip


def test_a_pass_records_which_interpreter_versions_loaded_which_model_and_a_failure_removes_it(tmp_path):
    from compress.io import read_json, sha256_file

    bundle = tmp_path / "pi.tar.gz"
    bundle.write_bytes(b"bundle bytes")
    path = arm.write_verification(bundle, passing_result(bundle))
    assert path == tmp_path / "pi.tar.gz.verified.json"
    record = read_json(path)
    assert record["schema"] == "compress.verification/1" and record["bundle_sha256"] == sha256_file(bundle)
    primary, fallback = record["models"]["model.tflite"], record["models"]["fallback-weight-only.tflite"]
    assert [(v["interpreter"], v["version"]) for v in primary["verified"]] == [("ai_edge_litert", "2.3.0")]
    assert [(v["interpreter"], v["version"]) for v in fallback["verified"]] == [("tflite_runtime", "2.14.0")]
    assert fallback["sha256"] == "b" * 64 and fallback["ops"] == [{"op": "DEQUANTIZE", "version": 4}]
    assert "root" not in record["emulator"]
    assert arm.write_verification(bundle, passing_result(bundle, ok=False)) is None
    assert not path.exists()
