"""The app developer's kit: parity vectors are what the bundle's runner feeds, and a change is caught."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from compress.bundle import make_bundle
from compress.errors import CompressError
from compress.io import file_entries, read_json, sha256_file, write_json_atomic
from compress.parity import CONTRACT_FILE, PARITY_FILE, app_kit, check_bundle, check_kit
from tests.helpers.artifacts import cached_artifact

PROFILE = """name: {name}
format: tflite
runtime: litert
threads: 2
sequence_lengths: [16, 32]
input_dtype: int32
"""


@pytest.fixture(scope="module")
def tflite(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_artifact(tiny_bert_dir, tmp_path_factory.mktemp("artifacts"), "tflite", [16, 32])


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "targets"
    folder.mkdir()
    for name in ("android-tiny", "tiny-board"):
        (folder / f"{name}.yaml").write_text(PROFILE.format(name=name))
    monkeypatch.setenv("COMPRESS_TARGETS", str(folder))
    return folder


def make_run(root: Path, teacher: Path, artifact: Path, target: str, *, pair: bool = False) -> Path:
    """A finished run whose export stage holds ``artifact`` for ``target``."""
    stage = root / "02-export"
    stage.mkdir(parents=True)
    folder = Path(shutil.copytree(artifact, stage / f"{target}-fp32"))
    manifest = read_json(folder / "manifest.json")
    manifest.update(name=f"02-export/{target}-fp32", target=target, task={"text_pair": pair})
    write_json_atomic(folder / "manifest.json", manifest)
    write_json_atomic(stage / "manifest.json", {"complete": True, "produces": "artifacts", "files": []})
    stages = [{"index": 2, "type": "export", "dir": "02-export"}]
    write_json_atomic(root / "run.json", {"recipe": "tiny", "teacher_dir": str(teacher), "stages": stages})
    return root


def bundled(tmp_path: Path, teacher: Path, artifact: Path, target: str = "android-tiny", **options) -> Path:
    run = make_run(tmp_path / "run", teacher, artifact, target, pair=options.pop("pair", False))
    info = make_bundle(run, target, tmp_path / "b.tar.gz", **options)
    with tarfile.open(info["path"]) as tar:
        tar.extractall(tmp_path / "u", filter="data")
    (folder,) = (tmp_path / "u").iterdir()
    return folder


def bundle_runner(folder: Path):
    """The runner.py inside the bundle, imported from there: the code a device would run."""
    spec = importlib.util.spec_from_file_location(f"bundle_runner_{abs(hash(folder))}", folder / "runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(folder: Path) -> list[dict]:
    return read_json(folder / PARITY_FILE)["cases"]


def rewrite(folder: Path, name: str, text: str) -> None:
    """Change a bundle file and its manifest entry, as someone who edits both would."""
    (folder / name).write_text(text)
    manifest = read_json(folder / "manifest.json")
    entries = {e["path"]: e for e in file_entries(folder)}
    manifest["files"] = [entries[e["path"]] for e in manifest["files"]]
    write_json_atomic(folder / "manifest.json", manifest)


def test_a_phone_bundle_carries_the_kit_and_a_board_bundle_does_not(tflite, tiny_bert_dir, tmp_path, targets):
    phone = bundled(tmp_path / "phone", tiny_bert_dir, tflite)
    listed = {e["path"] for e in read_json(phone / "manifest.json")["files"]}
    assert {CONTRACT_FILE, PARITY_FILE} <= listed
    assert read_json(phone / "manifest.json")["app_kit"] == {
        "io_contract": CONTRACT_FILE,
        "parity_vectors": PARITY_FILE,
    }
    assert "parity-vectors.json" in (phone / "README.md").read_text()
    board = bundled(tmp_path / "board", tiny_bert_dir, tflite, target="tiny-board")
    assert not (board / PARITY_FILE).exists() and not (board / CONTRACT_FILE).exists()
    forced = bundled(tmp_path / "forced", tiny_bert_dir, tflite, target="tiny-board", app_kit=True)
    assert (forced / PARITY_FILE).is_file()


def test_regenerated_vectors_equal_the_carried_ones(tflite, tiny_bert_dir, tmp_path, targets):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    manifest, labels = read_json(folder / "manifest.json"), read_json(folder / "labels.json")
    assert check_kit(folder, manifest, labels, bundle_runner(folder)) == []
    again = app_kit(folder, manifest, labels)
    assert again[PARITY_FILE] == (folder / PARITY_FILE).read_bytes()
    assert again[CONTRACT_FILE] == (folder / CONTRACT_FILE).read_bytes()


def test_the_vectors_are_what_the_runner_feeds_the_model(tflite, tiny_bert_dir, tmp_path, targets):
    """Each case's arrays, fed to the model by hand, give the runner's own logits for its text."""
    from ai_edge_litert.interpreter import Interpreter

    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    runner = bundle_runner(folder).load(folder)
    interpreter = Interpreter(model_path=str(folder / "model.tflite"))
    contract = read_json(folder / CONTRACT_FILE)
    keys = {s["length"]: s["key"] for s in contract["models"][0]["signatures"]}
    assert sorted(keys) == [16, 32]
    encoded = [case for case in cases(folder) if "refused" not in case]
    for case in encoded[::7] + [c for c in encoded if c["category"] == "signature-boundary"]:
        signature = interpreter.get_signature_runner(keys[case["length"]])
        feeds = {
            name: np.array([case[name]], dtype=np.int32) for name in read_json(folder / PARITY_FILE)["inputs"]
        }
        by_hand = next(iter(signature(**feeds).values()))
        np.testing.assert_allclose(by_hand, runner.predict_logits([case["text"]]), atol=1e-5)


def test_the_vectors_cover_what_ports_get_wrong(tflite, tiny_bert_dir, tmp_path, targets):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    found = cases(folder)
    assert len(found) >= 250
    categories = {case["category"] for case in found}
    assert {"accents", "emoji", "cjk", "numbers-punctuation", "whitespace", "mixed-case"} <= categories
    refused = [case for case in found if "refused" in case]
    assert {case["text"] for case in refused} >= {"", " ", "\u00a0", "\u3000"}
    assert all("empty text" in case["refused"] for case in refused)
    long = [case for case in found if case["category"] == "long-truncated"]
    assert long and all(
        case["truncated"] and case["length"] == 32 and sum(case["attention_mask"]) == 32 for case in long
    )
    boundary = {
        int(case["id"].split("-")[1]): case["length"]
        for case in found
        if case["category"] == "signature-boundary"
    }
    assert boundary == {15: 16, 16: 16, 17: 32, 31: 32, 32: 32, 33: 32}  # 33 tokens: truncated to 32
    for case in found:
        if "refused" not in case:
            tokens = len(case["tokens"])
            assert case["attention_mask"] == [1] * tokens + [0] * (case["length"] - tokens)
            assert case["input_ids"][tokens:] == [0] * (case["length"] - tokens)


def test_pair_vectors_mark_the_second_text_and_truncate_the_longer_one(
    tflite, tiny_bert_dir, tmp_path, targets
):
    folder = bundled(tmp_path, tiny_bert_dir, tflite, pair=True)
    found = cases(folder)
    assert all(case["category"].startswith("pair:") and "pair" in case for case in found)
    short_long = next(case for case in found if case["category"] == "pair:short+long")
    types = short_long["token_type_ids"]
    assert short_long["truncated"] and 1 in types and types[: types.index(1)] == [0] * types.index(1)
    # tokenizers' longest_first: 29 places for two texts longer than half of them each (19 and 200+
    # tokens): the shorter keeps 14 (the floor of half), the longer 15; [CLS] and [SEP] around the first
    alone = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(short_long["text"]).ids
    assert len(alone) - 2 == 19 and short_long["length"] == 32 and sum(short_long["attention_mask"]) == 32
    assert types.index(1) == 1 + 14 + 1 and types.count(1) == 15 + 1
    long_short = next(case for case in found if case["id"] == "pair-long-short-001")
    assert long_short["token_type_ids"].count(0) == 1 + 15 + 1 and long_short["truncated"]
    assert any("refused" in case and case["pair"] == "" for case in found)
    assert check_kit(folder, read_json(folder / "manifest.json"), read_json(folder / "labels.json")) == []


def test_a_tampered_vector_file_is_caught(tflite, tiny_bert_dir, tmp_path, targets):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    original = (folder / PARITY_FILE).read_text()
    # changed alone: the manifest's sha256 no longer matches
    (folder / PARITY_FILE).write_text(original.replace('"input_ids":[2,', '"input_ids":[3,', 1))
    with pytest.raises(CompressError, match=r"parity-vectors\.json: sha256 differs from manifest\.json"):
        check_bundle(folder)
    # changed with its manifest entry: regenerating finds the case
    rewrite(folder, PARITY_FILE, original.replace('"input_ids":[2,', '"input_ids":[3,', 1))
    result = check_bundle(folder)
    assert result["problems"] == [
        f"{folder / PARITY_FILE}: plain-000: input_ids differ at position 0: carried 3, runner 2"
    ]


DAMAGE = [
    (
        ('"attention_mask":[1,', '"attention_mask":[2,'),
        r"cases\[0\]\.attention_mask\[0\]: input should be 0 or 1 \(got 2\)",
    ),
    (('"pad_id": 0', '"pad_id": "zero"'), r"pad_id: input should be a valid integer"),
    (('"length":32,', '"length":31,'), r"cases\[0\]: input_ids has 32 values for length 31"),
    (('"cases": [', '"cases": ['), r"not valid JSON"),
]


@pytest.mark.parametrize(("change", "message"), DAMAGE)
def test_a_damaged_vector_file_is_one_line_naming_the_key(
    tflite, tiny_bert_dir, tmp_path, targets, change, message
):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    text = (folder / PARITY_FILE).read_text()
    rewrite(folder, PARITY_FILE, text.replace(*change, 1) if change[0] != change[1] else text[:100])
    with pytest.raises(CompressError, match=message) as info:
        check_bundle(folder)
    assert "\n" not in str(info.value) and str(folder / PARITY_FILE) in str(info.value)


def test_a_changed_contract_is_caught(tflite, tiny_bert_dir, tmp_path, targets):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    contract = read_json(folder / CONTRACT_FILE)
    contract["tokenizer"]["lowercase"] = False
    rewrite(folder, CONTRACT_FILE, json.dumps(contract))
    assert check_bundle(folder)["problems"] == [
        f"{folder / CONTRACT_FILE}: tokenizer differs from what the model files, tokenizer and runner give"
    ]
    contract["tokenizer"]["lowercase"] = "yes"
    rewrite(folder, CONTRACT_FILE, json.dumps(contract))
    with pytest.raises(
        CompressError, match=r"io-contract\.json: tokenizer\.lowercase: input should be a valid boolean"
    ):
        check_bundle(folder)


def test_a_port_is_checked_against_the_vectors(tflite, tiny_bert_dir, tmp_path, targets):
    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    bundle = tmp_path / "b.tar.gz"
    names = read_json(folder / PARITY_FILE)["inputs"]
    answers = [
        {"id": c["id"], "refused": True} if "refused" in c else {"id": c["id"], **{n: c[n] for n in names}}
        for c in cases(folder)
    ]
    port = tmp_path / "port.jsonl"
    port.write_text("".join(json.dumps(a) + "\n" for a in answers))
    assert check_bundle(bundle, port)["problems"] == []
    cjk = next(i for i, c in enumerate(cases(folder)) if c["category"] == "cjk")
    answers[cjk]["input_ids"][3] += 1
    refused = next(i for i, a in enumerate(answers) if a.get("refused"))
    answers[refused] = {"id": answers[refused]["id"], **{n: [0] * 16 for n in names}}
    port.write_text("".join(json.dumps(a) + "\n" for a in answers[:-1]))
    problems = check_bundle(bundle, port)["problems"]
    assert len(problems) == 3
    assert problems[0].startswith(f"{answers[cjk]['id']}: input_ids differ at position 3: carried ")
    assert problems[1].startswith(f"{answers[refused]['id']}: the runner refuses it, the port does not")
    assert problems[2] == f"{answers[-1]['id']}: no answer from the port"
    port.write_text('{"id": "plain-000", "input_ids": [-1]}\n')
    with pytest.raises(
        CompressError,
        match=r"port\.jsonl:1: input_ids\[0\]: input should be greater than or equal to 0 \(got -1\)",
    ):
        check_bundle(bundle, port)


def test_check_parity_command_exits_1_on_a_difference(tflite, tiny_bert_dir, tmp_path, targets):
    from click.testing import CliRunner

    from compress.cli_deploy import check_parity_cmd

    folder = bundled(tmp_path, tiny_bert_dir, tflite)
    ok = CliRunner().invoke(check_parity_cmd, [str(tmp_path / "b.tar.gz")])
    assert ok.exit_code == 0, ok.output
    assert "checked against the runner with this tokenizers: every array matches" in ok.output
    rewrite(
        folder, PARITY_FILE, (folder / PARITY_FILE).read_text().replace('"length":32,', '"length":16,', 1)
    )
    assert sha256_file(folder / PARITY_FILE) in (folder / "manifest.json").read_text()
    bad = CliRunner().invoke(check_parity_cmd, [str(folder)])
    assert bad.exit_code == 1


def test_a_forced_kit_covers_a_fallback_model_and_an_onnx_bundle(
    tflite, tiny_bert_dir, tmp_path, targets, tmp_path_factory
):
    from tests.helpers.fallbacks import FALLBACK, with_fallback

    pi = with_fallback(tflite, tmp_path / "with-fallback")
    folder = bundled(tmp_path / "pi", tiny_bert_dir, pi, target="tiny-board", app_kit=True)
    contract = read_json(folder / CONTRACT_FILE)
    assert [model["path"] for model in contract["models"]] == ["model.tflite", FALLBACK]
    assert contract["fallbacks"][0]["interpreter"] == "tflite_runtime"
    assert check_bundle(folder)["problems"] == []
    onnx = cached_artifact(tiny_bert_dir, tmp_path_factory.mktemp("onnx"), "onnx", [32])
    (targets / "tiny-board.yaml").write_text(
        PROFILE.format(name="tiny-board").replace("tflite", "onnx").replace("litert", "onnxruntime")
        .replace("int32", "int64").replace("[16, 32]", "[32]")
    )  # fmt: skip
    folder = bundled(tmp_path / "onnx", tiny_bert_dir, onnx, target="tiny-board", app_kit=True)
    parity = read_json(folder / PARITY_FILE)
    assert parity["sequence_lengths"] is None  # dynamic axes: each text at its own length, no padding
    assert all(sum(c["attention_mask"]) == c["length"] for c in parity["cases"] if "refused" not in c)
    assert read_json(folder / CONTRACT_FILE)["models"][0]["signatures"][0]["inputs"][0]["dtype"] == "int64"
    assert check_bundle(folder)["problems"] == []


def test_check_parity_prints_no_interpreter_log_line(tflite, tiny_bert_dir, tmp_path, targets):
    """check-parity's terminal holds compress's lines only: LiteRT writes "INFO: Created TensorFlow Lite
    XNNPACK delegate for CPU." to descriptor 2 from C++ once per process when a model first runs, which a
    subprocess sees and CliRunner does not. The kit's interpreter loads run inside ``quieted``."""
    import os
    import subprocess
    import sys

    bundled(tmp_path, tiny_bert_dir, tflite)
    command = [sys.executable, "-m", "compress.cli", "check-parity", str(tmp_path / "b.tar.gz")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "every array matches" in done.stdout
    assert "XNNPACK" not in done.stderr + done.stdout, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("compress: ")] == []
