"""Device profiles: what an artifact must look like to run on a board or phone.

Quantize and export read a profile instead of loose flags, so "raspberry-pi-4" means one thing
everywhere: the format, thread count, fixed sequence lengths, allowed schemes and budgets. The stock
profiles are package data (``compress/profiles/*.yaml``), so a wheel install has them as a checkout does;
``$COMPRESS_TARGETS`` points at a folder of one's own instead.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from compress.config import MAX_CONFIG_BYTES, Strict, validation_error_line
from compress.errors import CompressError, RecipeError

Scheme = Literal["weight-only", "dynamic", "static"]
PRIMARY_INTERPRETER = {"litert": "ai_edge_litert", "onnxruntime": "onnxruntime"}
"""The Python module that runs a target's primary model (the runner imports it first)."""


class Fallback(Strict):
    """A second model in the same artifact, for an interpreter that computes the primary one wrongly.

    The runner picks it when it finds ``interpreter`` older than ``below``; the quantize stage writes it
    when the primary's scheme is one of ``schemes``, and ``reason`` goes into the artifact manifest."""

    interpreter: Literal["tflite_runtime", "ai_edge_litert"]
    below: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$")
    """Versions older than this get the fallback model (e.g. "2.15": every tflite-runtime release)."""
    schemes: list[Scheme] = Field(min_length=1)
    """Primary schemes this interpreter computes wrongly."""
    scheme: Scheme = "weight-only"
    """What the fallback model is; weight-only computes in float, like the fp32 model."""
    reason: str = Field(min_length=1)


class QuantizationRules(Strict):
    schemes: list[Scheme] = Field(default_factory=lambda: ["dynamic", "static"], min_length=1)
    """Schemes allowed on this target. weight-only (TFLite): int8 weights dequantized at load time,
    float compute; dynamic: int8 weights with activations quantized at run time; static: int8
    weights and calibrated int8 activations."""
    granularity: Literal["per-channel", "per-tensor"] = "per-channel"
    """Weight granularity for the integer kernels (dynamic, static); weight-only is always
    per-channel, since the weights are dequantized before any kernel sees them."""
    activations: Literal["int8", "uint8"] = "int8"
    float_fallback: bool = True
    fallbacks: list[Fallback] = Field(default_factory=list)
    """TFLite: interpreters that get a second model (see ``Fallback``)."""

    @model_validator(mode="after")
    def _fallbacks_differ(self) -> QuantizationRules:
        for rule in self.fallbacks:
            if rule.scheme in rule.schemes:
                raise ValueError(
                    f"fallbacks: {rule.interpreter} gets scheme {rule.scheme}, one of the schemes it "
                    f"computes wrongly ({rule.schemes}); give it another (weight-only computes in float)"
                )
        return self


class Budgets(Strict):
    max_bytes: int | None = Field(None, gt=0)
    max_latency_p50_ms: float | None = Field(None, gt=0)


class TargetProfile(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    format: Literal["onnx", "tflite"]
    runtime: Literal["onnxruntime", "litert"]
    arch: Literal["aarch64", "x86_64"] = "aarch64"
    cpu: str = ""
    threads: int = Field(4, gt=0, le=256)
    sequence_lengths: list[int] = Field(min_length=1)
    input_dtype: Literal["int32", "int64"]
    opset: int = Field(17, ge=13, le=23)
    quantization: QuantizationRules = Field(default_factory=QuantizationRules)
    budgets: Budgets = Field(default_factory=Budgets)

    @model_validator(mode="after")
    def _check(self) -> TargetProfile:
        if (self.format == "onnx") != (self.runtime == "onnxruntime"):
            raise ValueError(f"format {self.format} cannot run on runtime {self.runtime}")
        if any(length <= 0 or length > 8192 for length in self.sequence_lengths):
            raise ValueError("sequence_lengths must be between 1 and 8192")
        if self.format == "onnx" and "weight-only" in self.quantization.schemes:
            raise ValueError(
                "quantization.schemes: weight-only is a TFLite scheme (onnxruntime has no int8 "
                "weight-only MatMul); use dynamic for onnx targets"
            )
        if self.format == "onnx" and self.quantization.fallbacks:
            raise ValueError("quantization.fallbacks are for TFLite targets (a second .tflite model)")
        if self.format == "tflite" and self.input_dtype != "int32":
            raise ValueError("tflite targets need input_dtype int32 (mobile runtimes reject int64)")
        return self

    @property
    def max_length(self) -> int:
        return max(self.sequence_lengths)

    @property
    def interpreters(self) -> list[str]:
        """The interpreter modules this target names: the primary first, then each fallback's."""
        named = [PRIMARY_INTERPRETER[self.runtime]]
        return named + [r.interpreter for r in self.quantization.fallbacks if r.interpreter not in named]

    def fallbacks_for(self, scheme: str) -> list[Fallback]:
        """The fallback rules that apply when the primary model is quantized with ``scheme``."""
        return [rule for rule in self.quantization.fallbacks if scheme in rule.schemes]


def stock_targets_dir() -> Path:
    """The profiles shipped inside the package, found through its loader rather than the source tree,
    so an installed wheel, an editable install and a checkout all resolve them the same way."""
    # a package installed by pip (wheel or editable) lives in a folder, so this is a real path
    return Path(str(resources.files("compress").joinpath("profiles")))


def targets_dir() -> Path:
    """``$COMPRESS_TARGETS`` if set (it replaces the stock profiles), else the stock profiles."""
    env = os.environ.get("COMPRESS_TARGETS")
    return Path(env) if env else stock_targets_dir()


def load_target_file(path: Path) -> TargetProfile:
    from compress.io import require_regular_file
    from compress.yamlpos import load_yaml_with_lines

    try:
        size = require_regular_file(path, "check $COMPRESS_TARGETS").st_size
    except CompressError as exc:
        raise RecipeError(str(exc)) from None
    if size > MAX_CONFIG_BYTES:
        raise RecipeError(
            f"{path}: {size} bytes, more than a target profile's {MAX_CONFIG_BYTES}; is it one?"
        )
    data, lines = load_yaml_with_lines(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}:1: a target profile must be a mapping of keys, got {type(data).__name__}")
    try:
        profile = TargetProfile.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(validation_error_line(path, lines, exc)) from None
    if profile.name != path.stem:
        raise RecipeError(f"{path}: name '{profile.name}' must match the file name '{path.stem}'")
    return profile


def available_targets(folder: Path | None = None) -> list[str]:
    folder = folder or targets_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_target(name: str, folder: Path | None = None) -> TargetProfile:
    folder = folder or targets_dir()
    path = folder / f"{name}.yaml"
    if name not in available_targets(folder):
        known = ", ".join(available_targets(folder)) or "none"
        raise RecipeError(f"unknown target '{name}'; known targets in {folder}: {known}")
    return load_target_file(path)
