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
        "first_differing_lines": [2],
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
    assert strict["agree"] == 1 and strict["near_ties"] == 0 and strict["first_differing_lines"] == [1, 2]
    loose = compare(host, arm, tie_margin=0.5)
    assert loose["near_ties"] == 1 and loose["host_margins"] == {"1": 0.1, "2": 2.0}


def test_min_agreement_tolerates_a_share_of_flipped_labels_but_not_a_missing_row():
    run = {"agree": 248, "near_ties": 0, "total": 250}
    assert not arm.run_passes(run, 250)  # default: every label as on the host
    assert arm.run_passes(run, 250, min_agreement=0.99)  # 2 of 250 = 0.8% may differ
    assert not arm.run_passes({**run, "agree": 247}, 250, min_agreement=0.99)
    assert arm.run_passes({**run, "agree": 247, "near_ties": 1}, 250, min_agreement=0.99)
    assert not arm.run_passes({"error": "crashed"}, 250, min_agreement=0.0)
