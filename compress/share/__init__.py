"""ALBERT-style compression of a trained encoder: layer sharing, factorised embedding, vocabulary pruning.

Each transform works in place on a loaded Hugging Face classifier; ``compress.share.model`` saves
and reloads the result with every shared tensor stored once.
"""
