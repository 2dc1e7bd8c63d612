"""The minimal on-device runner that ships in a deploy bundle (numpy, tokenizers and an interpreter only)."""
