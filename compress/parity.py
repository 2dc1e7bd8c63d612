"""The app developer's kit: tokenizer parity vectors and the I/O contract, in a bundle an app embeds.

A phone app does not run ``runner.py``: it ports the tokenizer to Kotlin or Swift and fills the
interpreter's input tensors itself. The port is right when, for every text, it fills the very arrays
the bundle's runner would. ``parity-vectors.json`` holds those arrays for a few hundred texts written
for the purpose (``compress.parity_texts``), computed by the runner's own functions (its Encoder, its
choice of signature length, its padding) from the bundle's own tokenizer.json and model signatures.
``io-contract.json`` says the same in rules: input names, dtypes and shapes per signature, the output,
labels, and the tokenizer's settings (lowercasing, accents, truncation, padding, special tokens).

Both files are read back (``check_kit``) through typed schemas, so a damaged file is one line naming
the file, key and fix; the check regenerates every vector and names each case that differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from compress.errors import CompressError
from compress.io import check_model, read_json
from compress.parity_texts import Case, boundary_texts, pair_cases, single_cases
from compress.run_layout import MANIFEST_FILE
from compress.subjects import Open

log = logging.getLogger(__name__)

PARITY_FILE = "parity-vectors.json"
CONTRACT_FILE = "io-contract.json"
PARITY_SCHEMA = "compress.parity-vectors/1"
CONTRACT_SCHEMA = "compress.io-contract/1"
REDO_KIT = "bundle the run again (compress bundle RUN --target TARGET)"
PHONE_PREFIXES = ("android", "ios")
"""Targets whose name starts with one of these run inside an app (``compress bundle`` adds the kit)."""
EMPTY_RULE = (
    "a text (or either text of a pair) with no character other than whitespace (Python str.strip: "
    "Unicode White_Space, e.g. U+00A0, U+3000) is refused, not encoded"
)
TRUNCATION_RULE = (
    "token counts are taken before special tokens are added. One text keeps its first max_length minus "
    "its special tokens. A pair shares that budget (max_length minus 3 for BERT) as Hugging Face "
    "tokenizers' longest_first does: with n1 <= n2 the two texts' counts, the longer text is cut to "
    "max(n1, budget - n1); if n1 plus that still exceeds the budget, the shorter keeps floor(budget / 2) "
    "and the longer ceil(budget / 2). Each text keeps its first tokens (direction right)"
)
NonNegative = Annotated[StrictInt, Field(ge=0)]
Length = Annotated[StrictInt, Field(gt=0)]


def is_phone_target(target: str) -> bool:
    return target.split("-")[0] in PHONE_PREFIXES


class Vector(Open):
    """One case: the text (and pair), then either why the runner refuses it or the arrays it feeds."""

    id: StrictStr
    category: StrictStr
    text: StrictStr
    pair: StrictStr | None = None
    refused: StrictStr | None = None
    tokens: list[StrictStr] | None = None
    truncated: StrictBool | None = None
    length: Length | None = None
    input_ids: list[NonNegative] | None = None
    attention_mask: list[Literal[0, 1]] | None = None
    token_type_ids: list[NonNegative] | None = None

    @model_validator(mode="after")
    def _arrays(self) -> Vector:
        if self.refused is not None:
            return self
        if (
            self.length is None
            or self.input_ids is None
            or self.attention_mask is None
            or self.tokens is None
        ):
            raise ValueError("a case that is not refused needs tokens, length, input_ids and attention_mask")
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            values = getattr(self, name)
            if values is not None and len(values) != self.length:
                raise ValueError(f"{name} has {len(values)} values for length {self.length}")
        return self


class ParityFile(Open):
    schema_: Literal["compress.parity-vectors/1"] = Field(alias="schema")
    tokenizer_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    inputs: list[Literal["input_ids", "attention_mask", "token_type_ids"]] = Field(min_length=1)
    sequence_lengths: list[Length] | None
    max_length: Length
    pad_id: NonNegative
    text_pair: StrictBool
    cases: list[Vector] = Field(min_length=1)

    @model_validator(mode="after")
    def _cases(self) -> ParityFile:
        seen: set[str] = set()
        for index, case in enumerate(self.cases):
            if case.id in seen:
                raise ValueError(f"cases[{index}]: id {case.id!r} is used twice")
            seen.add(case.id)
            missing = [n for n in self.inputs if case.refused is None and getattr(case, n, None) is None]
            if missing:
                raise ValueError(f"cases[{index}] ({case.id}): no {missing[0]}, one of the model's inputs")
        return self


class TensorSpec(Open):
    name: StrictStr
    dtype: StrictStr
    shape: list[StrictInt]


class Signature(Open):
    key: StrictStr | None
    length: Length | None
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)


class ModelSpec(Open):
    path: StrictStr
    signatures: list[Signature] = Field(min_length=1)


class TokenizerSpec(Open):
    file: StrictStr
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
    lowercase: StrictBool
    strip_accents: StrictBool
    max_length: Length
    truncation: dict[str, Any]
    padding: dict[str, Any]
    special_tokens: list[dict[str, Any]]


class ContractFile(Open):
    schema_: Literal["compress.io-contract/1"] = Field(alias="schema")
    format: Literal["onnx", "tflite"]
    models: list[ModelSpec] = Field(min_length=1)
    labels: list[StrictStr] = Field(min_length=1)
    text_pair: StrictBool
    tokenizer: TokenizerSpec


def runner_module() -> ModuleType:
    """The runner compress copies into every bundle (the same file, so the same computation)."""
    from compress.runtime import runner

    return runner


def _numpy_name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


def tflite_signatures(path: Path) -> list[dict[str, Any]]:
    """Each signature of a .tflite model: its key, fixed length, and input/output names, dtypes, shapes."""
    from ai_edge_litert.interpreter import Interpreter

    try:
        interpreter = Interpreter(model_path=str(path))
    except (ValueError, RuntimeError) as exc:
        raise CompressError(
            f"{path}: cannot be loaded ({str(exc).strip().splitlines()[0]}); {REDO_KIT}"
        ) from None
    signatures = []
    for key in sorted(interpreter.get_signature_list()):
        runner = interpreter.get_signature_runner(key)

        def specs(details: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {
                    "name": name,
                    "dtype": _numpy_name(d["dtype"]),
                    "shape": [int(n) for n in d["shape_signature"]],
                }
                for name, d in sorted(details.items())
            ]

        inputs, outputs = specs(runner.get_input_details()), specs(runner.get_output_details())
        ids = next((spec for spec in inputs if spec["name"] == "input_ids"), None)
        length = (
            ids["shape"][1] if ids is not None and len(ids["shape"]) == 2 and ids["shape"][1] > 0 else None
        )
        signatures.append({"key": key, "length": length, "inputs": inputs, "outputs": outputs})
    return sorted(signatures, key=lambda s: s["length"] or 0)


ONNX_TYPES = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32"}


def onnx_signatures(path: Path) -> list[dict[str, Any]]:
    """The one signature of an ONNX model; a dynamic axis is -1 and a dynamic length None."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own pybind types
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CompressError(f"{path}: cannot be loaded ({reason}); {REDO_KIT}") from None

    def specs(values: list[Any]) -> list[dict[str, Any]]:
        return [
            {
                "name": v.name,
                "dtype": ONNX_TYPES.get(v.type, v.type),
                "shape": [d if isinstance(d, int) and d > 0 else -1 for d in v.shape],
            }
            for v in sorted(values, key=lambda v: v.name)
        ]

    inputs = specs(session.get_inputs())
    ids = next((spec for spec in inputs if spec["name"] == "input_ids"), {"shape": [-1, -1]})
    length = ids["shape"][1] if ids["shape"][1] > 0 else None
    return [{"key": None, "length": length, "inputs": inputs, "outputs": specs(session.get_outputs())}]


def model_specs(folder: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The primary model and each fallback, with their signatures read from the model files. The
    interpreters' own C++ log lines stay off the terminal unless -v (``quieted``)."""
    from compress.terminal import quieted

    fmt = manifest["format"]
    paths = [f"model.{fmt}", *(entry["path"] for entry in manifest.get("fallbacks") or [])]
    read = tflite_signatures if fmt == "tflite" else onnx_signatures
    with quieted():
        return [{"path": rel, "signatures": read(folder / rel)} for rel in paths]


def fixed_lengths(specs: list[dict[str, Any]], where: Path) -> list[int] | None:
    """The signature lengths the runner picks from (None: dynamic), the same for every model file, or
    the vectors would hold for one model only."""
    found = {spec["path"]: [s["length"] for s in spec["signatures"]] for spec in specs}
    first = next(iter(found.values()))
    if any(lengths != first for lengths in found.values()):
        raise CompressError(f"{where}: the model files have different signature lengths {found}; {REDO_KIT}")
    return None if None in first else sorted(first)


def _normalizers(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not config:
        return []
    if config.get("type") == "Sequence":
        return [n for child in config.get("normalizers") or [] for n in _normalizers(child)]
    return [config]


def text_rules(tokenizer_json: dict[str, Any]) -> tuple[bool, bool]:
    """(lowercase, strip_accents) as the tokenizer applies them; BertNormalizer's strip_accents None
    follows lowercase, as in BERT's uncased models."""
    lowercase = strip = False
    for normalizer in _normalizers(tokenizer_json.get("normalizer")):
        kind = normalizer.get("type")
        if kind == "BertNormalizer":
            lowercase = lowercase or bool(normalizer.get("lowercase"))
            accents = normalizer.get("strip_accents")
            strip = strip or bool(normalizer.get("lowercase") if accents is None else accents)
        lowercase = lowercase or kind == "Lowercase"
        strip = strip or kind == "StripAccents"
    return lowercase, strip


def tokenizer_spec(folder: Path, encoder: Any) -> dict[str, Any]:
    """The tokenizer's settings a port must copy, read from tokenizer.json and the runner's Encoder."""
    raw = (folder / "tokenizer.json").read_bytes()
    config = json.loads(raw)
    lowercase, strip_accents = text_rules(config)
    tokenizer = encoder.tokenizer
    model = {k: v for k, v in (config.get("model") or {}).items() if k not in ("vocab", "merges")}
    return {
        "file": "tokenizer.json",
        "sha256": hashlib.sha256(raw).hexdigest(),
        "model": model,
        "vocab_size": tokenizer.get_vocab_size(),
        "lowercase": lowercase,
        "strip_accents": strip_accents,
        "normalizer": config.get("normalizer"),
        "pre_tokenizer": config.get("pre_tokenizer"),
        "post_processor": config.get("post_processor"),
        "max_length": encoder.max_length,
        "truncation": dict(tokenizer.truncation or {}),
        "truncation_rule": TRUNCATION_RULE,
        "padding": {
            "side": "right",
            "pad_id": encoder.pad_id,
            "pad_token": tokenizer.id_to_token(encoder.pad_id),
            "to": "the smallest signature length that holds the tokens (dynamic models: no padding)",
            "attention_mask": "1 on every token, 0 on padding",
            "token_type_ids": "the post-processor's type ids on tokens, 0 on padding",
        },
        "special_tokens": [
            {"token": token["content"], "id": token["id"]}
            for token in config.get("added_tokens") or []
            if token.get("special")
        ],
        "empty_text": EMPTY_RULE,
    }


def encode_case(
    runner: ModuleType, encoder: Any, full: Any, lengths: list[int] | None, inputs: list[str], case: Case
) -> dict[str, Any]:
    """The runner's answer for one case: its refusal, or the arrays it feeds the model (batch row 0).
    ``full`` is the same tokenizer without truncation, to tell whether the text was cut."""
    import numpy as np

    row: dict[str, Any] = {"id": case.id, "category": case.category, "text": case.text}
    if case.pair is not None:
        row["pair"] = case.pair
    try:
        runner.check_text(case.text, "text")
        if case.pair is not None:
            runner.check_text(case.pair, "pair")
    except runner.RunnerError as exc:
        return {**row, "refused": str(exc)}
    [(ids, type_ids)] = encoder.encode([case.text], None if case.pair is None else [case.pair])
    length = runner.length_for(lengths, len(ids))
    feeds = runner.make_feeds([(ids, type_ids)], length, encoder.pad_id, dict.fromkeys(inputs, np.int64))
    untruncated = full.encode(case.text) if case.pair is None else full.encode(case.text, case.pair)
    return {
        **row,
        "tokens": [encoder.tokenizer.id_to_token(i) for i in ids],
        "truncated": len(untruncated.ids) > len(ids),
        "length": length,
        **{name: feeds[name][0].tolist() for name in inputs},
    }


class Encoding:
    """The runner's Encoder for a folder and the signature lengths its model runs at."""

    def __init__(self, folder: Path, manifest: dict[str, Any], runner: ModuleType):
        from tokenizers import Tokenizer

        self.runner, self.specs = runner, model_specs(folder, manifest)
        self.lengths = fixed_lengths(self.specs, folder / MANIFEST_FILE)
        limit = runner.token_limit(manifest["max_length"], self.lengths)
        self.encoder = runner.Encoder(folder / "tokenizer.json", limit)
        self.full = Tokenizer.from_str(self.encoder.tokenizer.to_str())
        self.full.no_truncation()
        names = {spec["name"] for spec in self.specs[0]["signatures"][0]["inputs"]}
        self.inputs = [name for name in runner.INPUT_NAMES if name in names]
        self.tokenizer = tokenizer_spec(folder, self.encoder)

    def count(self, text: str) -> int:
        return len(self.full.encode(text).ids)

    def vectors(self, cases: list[Case]) -> list[dict[str, Any]]:
        return [
            encode_case(self.runner, self.encoder, self.full, self.lengths, self.inputs, c) for c in cases
        ]


def project_cases(encoding: Encoding, text_pair: bool) -> list[Case]:
    if text_pair:
        return pair_cases()
    return single_cases() + boundary_texts(encoding.count, encoding.lengths or [encoding.encoder.max_length])


def contract_of(encoding: Encoding, manifest: dict[str, Any], labels: list[str], text_pair: bool) -> dict:
    return {
        "schema": CONTRACT_SCHEMA,
        "format": manifest["format"],
        "models": encoding.specs,
        "fallbacks": manifest.get("fallbacks") or [],
        "labels": labels,
        "text_pair": text_pair,
        "tokenizer": encoding.tokenizer,
        "output": "logits, float32 [batch, labels]: softmax for scores, argmax indexes labels",
        "parity_vectors": PARITY_FILE,
    }


def settings_of(encoding: Encoding, text_pair: bool) -> dict[str, Any]:
    """What every vector of a parity file shares."""
    return {
        "schema": PARITY_SCHEMA,
        "tokenizer_sha256": encoding.tokenizer["sha256"],
        "inputs": encoding.inputs,
        "sequence_lengths": encoding.lengths,
        "max_length": encoding.encoder.max_length,
        "pad_id": encoding.encoder.pad_id,
        "text_pair": text_pair,
    }


def app_kit(folder: Path, manifest: dict[str, Any], labels: list[str]) -> dict[str, bytes]:
    """``io-contract.json`` and ``parity-vectors.json`` for the model files and tokenizer in ``folder``."""
    encoding = Encoding(folder, manifest, runner_module())
    text_pair = bool((manifest.get("task") or {}).get("text_pair"))
    cases = project_cases(encoding, text_pair)
    log.info("computing tokenizer parity vectors for %d texts", len(cases))
    return {
        CONTRACT_FILE: _dump(contract_of(encoding, manifest, labels, text_pair)),
        PARITY_FILE: vectors_json(settings_of(encoding, text_pair), encoding.vectors(cases)),
    }


def vectors_json(settings: dict[str, Any], cases: list[dict[str, Any]]) -> bytes:
    """One JSON document, one case per line: small, and a diff of two files reads case by case."""
    head = "".join(f"{json.dumps(key)}: {json.dumps(value)},\n" for key, value in settings.items())
    body = ",\n".join(json.dumps(case, ensure_ascii=False, separators=(",", ":")) for case in cases)
    return f'{{\n{head}"cases": [\n{body}\n]}}\n'.encode()


def _dump(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def read_kit(folder: Path) -> tuple[ParityFile, dict[str, Any], dict[str, Any]]:
    """Both kit files of a bundle folder, each checked against its schema (one line naming the key)."""
    fix = "the bundle carries it when made for a phone target (or with --app-kit)"
    parity_raw = read_json(folder / PARITY_FILE, fix=fix, redo=REDO_KIT)
    contract_raw = read_json(folder / CONTRACT_FILE, fix=fix, redo=REDO_KIT)
    parity = check_model(folder / PARITY_FILE, parity_raw, ParityFile, redo=REDO_KIT)
    check_model(folder / CONTRACT_FILE, contract_raw, ContractFile, redo=REDO_KIT)
    return parity, parity_raw, contract_raw


def _first_difference(carried: list[Any], now: list[Any], other: str = "runner") -> str:
    for index, (a, b) in enumerate(zip(carried, now, strict=False)):
        if a != b:
            return f"position {index}: carried {a!r}, {other} {b!r}"
    return f"the end: {len(carried)} values carried, {len(now)} from the {other}"


def compare_vectors(carried: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[str]:
    """One line per case whose carried answer differs from the runner's (its first difference)."""
    lines = []
    for old, new in zip(carried, fresh, strict=True):
        if ("refused" in old) != ("refused" in new):
            said = "a refusal" if "refused" in old else "arrays"
            does = "refuses" if "refused" in new else "encodes"
            lines.append(f"{old['id']}: carried {said}, the runner {does} it")
            continue
        for key in ("length", "truncated", "tokens", "input_ids", "attention_mask", "token_type_ids"):
            a, b = old.get(key), new.get(key)
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                lines.append(f"{old['id']}: {key} differ at {_first_difference(a, b)}")
            else:
                lines.append(f"{old['id']}: {key} carried {a!r}, runner {b!r}")
            break
    return lines


def check_kit(
    folder: Path, manifest: dict[str, Any], labels: list[str], runner: ModuleType | None = None
) -> list[str]:
    """Regenerate the vectors of the carried texts and the contract from ``folder``'s own files (the
    model signatures, tokenizer.json, and the runner's functions); one line per difference, none when
    the kit is what this runner and tokenizer feed."""
    parity, parity_raw, contract_raw = read_kit(folder)
    encoding = Encoding(folder, manifest, runner or runner_module())
    text_pair = bool((manifest.get("task") or {}).get("text_pair"))
    problems = [
        f"{folder / PARITY_FILE}: {key} is {parity_raw.get(key)!r}, the runner gives {value!r}"
        for key, value in settings_of(encoding, text_pair).items()
        if parity_raw.get(key) != value
    ]
    carried = [case.model_dump(exclude_none=True) for case in parity.cases]
    fresh = encoding.vectors([Case(c.id, c.category, c.text, c.pair) for c in parity.cases])
    problems += [f"{folder / PARITY_FILE}: {line}" for line in compare_vectors(carried, fresh)]
    expected = json.loads(_dump(contract_of(encoding, manifest, labels, text_pair)))
    problems += [
        f"{folder / CONTRACT_FILE}: {key} differs from what the model files, tokenizer and runner give"
        for key in sorted(set(expected) | set(contract_raw))
        if expected.get(key) != contract_raw.get(key)
    ]
    return problems


class PortRow(Open):
    """One line of a port's output: the arrays it fills for a case, or that it refuses the text."""

    id: StrictStr
    refused: StrictBool = False
    input_ids: list[NonNegative] | None = None
    attention_mask: list[NonNegative] | None = None
    token_type_ids: list[NonNegative] | None = None


PORT_FORMAT = (
    'one JSON object per line: {"id": CASE_ID, "input_ids": [...], "attention_mask": [...], '
    '"token_type_ids": [...]} or {"id": CASE_ID, "refused": true}'
)


def read_port(path: Path) -> dict[str, PortRow]:
    """A port's answers by case id, every line checked (one error line naming the line and key)."""
    from pydantic import ValidationError

    from compress.io import read_bytes, schema_error_line

    try:
        text = read_bytes(path, fix=f"write your port's answers there: {PORT_FORMAT}").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CompressError(f"{path}: not UTF-8 (byte {exc.start}); write it as UTF-8") from None
    rows: dict[str, PortRow] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = PortRow.model_validate(json.loads(line))
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, ValidationError):
                raise CompressError(schema_error_line(where, exc, f"write {PORT_FORMAT}")) from None
            raise CompressError(f"{where}: not a JSON object; write {PORT_FORMAT}") from None
        if row.id in rows:
            raise CompressError(f"{where}: case {row.id!r} is answered twice; keep one line per case")
        rows[row.id] = row
    if not rows:
        raise CompressError(f"{path}: no answers; write {PORT_FORMAT}")
    return rows


def compare_port(parity: ParityFile, port: dict[str, PortRow]) -> list[str]:
    """One line per case where the port's arrays (or refusal) differ from the carried ones; a case the
    port did not answer, or an id the vectors do not hold, is a difference too."""
    lines, known = [], {case.id for case in parity.cases}
    for case in parity.cases:
        row = port.get(case.id)
        if row is None:
            lines.append(f"{case.id}: no answer from the port")
            continue
        if row.refused != (case.refused is not None):
            expected = "refuses it" if case.refused is not None else "encodes it"
            lines.append(f"{case.id}: the runner {expected}, the port does not ({case.category})")
            continue
        for name in parity.inputs:
            mine, theirs = getattr(case, name), getattr(row, name)
            if case.refused is None and mine != theirs:
                found = "no array" if theirs is None else _first_difference(mine, theirs, "port")
                lines.append(f"{case.id}: {name} differ at {found} ({case.category})")
                break
    lines += [f"{case_id}: not a case of the parity vectors" for case_id in port if case_id not in known]
    return lines


def check_bundle(bundle: Path, port: Path | None = None) -> dict[str, Any]:
    """Check a bundle's kit (a .tar.gz or an unpacked folder): every file against its manifest, then
    either the carried vectors against a fresh run of the runner's encoding, or a port's answers
    against the carried vectors. Returns the case count and one line per difference."""
    import tempfile

    from compress.io import require_path

    require_path(bundle, "make one with `compress bundle RUN --target TARGET --app-kit`")
    if bundle.is_dir():
        return _check_folder(bundle, port)
    from compress.arm import unpack

    with tempfile.TemporaryDirectory(prefix="compress-parity-") as scratch:
        return _check_folder(unpack(bundle, Path(scratch)), port)


def _check_folder(folder: Path, port: Path | None) -> dict[str, Any]:
    runner = runner_module()
    try:
        manifest = runner.read_manifest(folder)
        runner.verify_files(folder, manifest)
        labels = runner.read_labels(folder / "labels.json")
    except runner.RunnerError as exc:
        raise CompressError(str(exc)) from None
    parity = read_kit(folder)[0]
    if port is None:
        problems = check_kit(folder, manifest, labels, runner)
    else:
        problems = compare_port(parity, read_port(port))
    return {"cases": len(parity.cases), "problems": problems, "against": "port" if port else "runner"}
