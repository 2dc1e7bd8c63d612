"""``share``: ALBERT-style compression of a trained model, then distillation to win accuracy back.

Transforms run on the newest checkpoint in the run, cheapest to undo first: vocabulary pruning
(a lossless row selection for the training text) and position-table trimming (lossless for inputs
up to the kept length), then the SVD-factorised embedding (computed on
the pruned table, so the rank is spent on tokens the task uses), then feed-forward width pruning
(neurons ranked on the training text), then cross-layer tying. The
manifest records unique parameters, bytes and eval accuracy after every step, so a reader sees
what each transform cost before recovery paid it back.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from compress.config import Strict
from compress.distill.config import DistillOptions
from compress.errors import RecipeError
from compress.stages.base import StageConfig, StageContext, StageResult
from compress.stages.registry import register_stage

log = logging.getLogger(__name__)

FFN_SAMPLE_ROWS = 1024
"""Training rows whose tokens rank the feed-forward neurons for ``ffn`` pruning."""


class LayerSharing(Strict):
    mode: Literal["all", "attention", "ffn", "groups"] = "all"
    """all: one layer applied N times; attention / ffn: only that sub-block is shared (across all
    layers, or within each of ``groups``); groups: whole layers shared within each group."""
    groups: list[list[int]] | None = None
    """Layer indices per group, e.g. [[0, 1], [2, 3]]; a layer may be in one group only."""
    init: Literal["mean", "fit"] | int = "mean"
    """mean of the tied layers' weights, the position within each group whose weights are kept, or fit
    (with relax_rank): shared weights fitted jointly with the corrections, so that shared + correction
    lands closer to every trained layer than the mean does."""
    relax_rank: int | None = Field(None, gt=0)
    """Give each tied layer its own rank-r correction on every linear weight, initialised from the SVD
    of what tying took away from it (Relaxed Recursive Transformers); costs r x (in + out) parameters
    per linear per layer. Unset: plain ALBERT sharing."""


class VocabPruning(Strict):
    keep: list[str] = Field(default_factory=list)
    """Tokens to keep although the training text does not use them."""
    reserve: int = Field(0, ge=0)
    """Also keep the first N ids of the original vocabulary (its most frequent pieces)."""
    characters: Literal["seen", "all", "none"] = "seen"
    """Which one-character pieces to keep so that unseen words split into pieces instead of [UNK]:
    seen = those of every character the training text is written in; all = every one (text in
    other scripts too, ~2k rows for BERT); none = only pieces the training text used."""


class ShareConfig(StageConfig):
    type: Literal["share"] = "share"
    layers: LayerSharing | None = None
    embedding_rank: int | None = Field(None, gt=0)
    """E of the V×E + E×H factorised embedding (ALBERT uses 128); must be below the hidden size."""
    embedding_weights: Literal["frequency", "uniform"] = "frequency"
    """How the SVD behind embedding_rank weighs the table's rows: frequency = by how often each token
    occurs in the training text (plus one), so the rank goes to the rows the model reads most;
    uniform = every row alike (the plain best rank-E approximation of the table)."""
    vocab: VocabPruning | None = None
    ffn: int | None = Field(None, gt=0)
    """Keep the N feed-forward neurons of every layer that carry most of its output on the training text
    (expected squared activation times outgoing weight norm) and drop the rest: a plain model with
    ``intermediate_size`` N, unlike tying nothing is shared, so exported graphs keep fusable layers.
    Unset: keep them all."""
    positions: int | None = Field(None, gt=0)
    """Keep the position-table rows for inputs of up to N tokens (BERT learns 512) and drop the rest;
    N must cover task.max_length and every target's sequence lengths. Unset: keep them all."""
    recovery: DistillOptions | None = Field(default_factory=DistillOptions)
    """Distillation against the teacher after the transforms; null skips it."""

    @model_validator(mode="after")
    def _something_to_do(self) -> ShareConfig:
        if (
            self.layers is None
            and self.embedding_rank is None
            and self.vocab is None
            and self.positions is None
            and self.ffn is None
        ):
            raise ValueError("give at least one of layers, embedding_rank, vocab, positions or ffn")
        return self


def _measure(
    ctx: StageContext, model: Any, tokenizer: Any, step: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """Unique parameters and bytes, and eval accuracy with the model's current tokenizer."""
    from compress.share.model import parameter_stats
    from compress.training import classification_metrics, encode, predict_logits

    evals = ctx.split("eval")
    logits = predict_logits(model, encode(tokenizer, evals, ctx.recipe.task.max_length))
    row = {"step": step, **parameter_stats(model), **classification_metrics(logits, evals.labels), **extra}
    accuracy = row.get("accuracy")
    shown = "n/a" if accuracy is None else f"{accuracy:.4f}"
    log.info("share %s: %s parameters, eval accuracy %s", step, f"{row['parameters']:,}", shown)
    return row


def _sample_batches(
    ctx: StageContext, model: Any, tokenizer: Any, rows: int = FFN_SAMPLE_ROWS, batch_size: int = 64
) -> list[dict[str, Any]]:
    """Evenly spaced training rows, encoded in batches the model takes (what ``share.ffn`` ranks on)."""
    import torch

    from compress.training import encode, forward_inputs

    train = ctx.split("train")
    step = max(1, len(train) // rows)
    sample = train.subset(list(range(0, len(train), step))[:rows])
    loader = torch.utils.data.DataLoader(
        encode(tokenizer, sample, ctx.recipe.task.max_length), batch_size=batch_size
    )
    return [forward_inputs(model, batch) for batch in loader]


def _transform(ctx: StageContext, cfg: ShareConfig, model: Any, tokenizer: Any) -> tuple[Any, list[dict]]:
    from compress.share.factorize import factorize_embedding, frequency_weights
    from compress.share.model import set_sharing_spec
    from compress.share.positions import trim_positions
    from compress.share.tying import encoder_layers, make_plan, tie_layers
    from compress.share.vocab import prune_vocabulary, token_counts

    steps = [_measure(ctx, model, tokenizer, "input", {})]
    if cfg.vocab is not None:
        train = ctx.split("train")
        v = cfg.vocab
        tokenizer, sizes = prune_vocabulary(
            model,
            tokenizer,
            train.texts,
            train.pairs,
            keep=v.keep,
            reserve=v.reserve,
            characters=v.characters,
        )
        steps.append(_measure(ctx, model, tokenizer, "vocab", sizes))
    if cfg.positions is not None:
        sizes = trim_positions(model, tokenizer, cfg.positions)
        steps.append(_measure(ctx, model, tokenizer, "positions", sizes))
    if cfg.embedding_rank is not None:
        weights = None
        if cfg.embedding_weights == "frequency":
            train = ctx.split("train")
            rows = model.get_input_embeddings().num_embeddings
            weights = frequency_weights(token_counts(tokenizer, train.texts, train.pairs), rows)
        quality = factorize_embedding(model, cfg.embedding_rank, weights)
        quality["weights"] = cfg.embedding_weights
        set_sharing_spec(model, embedding_rank=cfg.embedding_rank)
        steps.append(_measure(ctx, model, tokenizer, "embedding", quality))
    if cfg.ffn is not None:
        from compress.share.ffn import check_size, neuron_importance, prune_ffn

        check_size(model, cfg.ffn)
        importance = neuron_importance(model, _sample_batches(ctx, model, tokenizer))
        steps.append(_measure(ctx, model, tokenizer, "ffn", prune_ffn(model, cfg.ffn, importance)))
    if cfg.layers is not None:
        plan = make_plan(
            cfg.layers.mode, len(encoder_layers(model)), cfg.layers.groups, cfg.layers.relax_rank
        )
        tie_layers(model, plan, init=cfg.layers.init)
        set_sharing_spec(model, layers=plan.to_json())
        steps.append(_measure(ctx, model, tokenizer, "layers", plan.to_json()))
    return tokenizer, steps


@register_stage("share", ShareConfig)
def run(ctx: StageContext) -> StageResult:
    from compress.models import load_classifier
    from compress.share.model import save_shared_checkpoint, sharing_spec
    from compress.training import set_seed

    cfg: ShareConfig = ctx.config  # type: ignore[assignment]
    set_seed(ctx.seed)
    model, tokenizer = load_classifier(ctx.input_dir, **ctx.recipe.teacher.load_options())
    try:
        tokenizer, steps = _transform(ctx, cfg, model, tokenizer)
    except RecipeError as exc:
        raise RecipeError(f"{ctx.where()}.{str(exc).removeprefix('share.')}") from None
    info: dict[str, Any] = {"compress_sharing": sharing_spec(model)}
    metrics: dict[str, Any] = {"steps": steps}
    if cfg.recovery is not None:
        from compress.distill.trainer import distill_model

        try:
            outcome = distill_model(model, tokenizer, ctx.teacher_dir, ctx, cfg.recovery)
        except RecipeError as exc:
            raise RecipeError(f"{ctx.where()}.recovery.{exc}") from None
        steps.append(_measure(ctx, model, tokenizer, "recovery", {}))
        metrics["recovery"] = outcome.metrics
        info["recovery"] = outcome.info
        if not outcome.is_main_process:
            return StageResult(metrics=metrics, info=info)
    save_shared_checkpoint(model, tokenizer, ctx.out_dir)
    first, last = steps[0], steps[-1]
    tied = next((s for s in steps if s["step"] == "layers"), None)
    metrics.update(
        parameters_before=first["parameters"],
        bytes_before=first["bytes"],
        parameters=last["parameters"],
        bytes=last["bytes"],
        checkpoint_bytes=(ctx.out_dir / "model.safetensors").stat().st_size,
        accuracy_before=first.get("accuracy"),
        accuracy_after_tying=tied.get("accuracy") if tied else None,
        accuracy=last.get("accuracy"),
    )
    return StageResult(metrics=metrics, info=info)
