"""The texts a bundle's tokenizer parity vectors are made of: written here, never taken from a user's data.

Each group aims at a place where a hand-written tokenizer port (Kotlin, Swift) tends to part from
Hugging Face ``tokenizers``: Unicode normalisation and accent stripping, lowercasing beyond ASCII
(Turkish dotted I, German sharp s), emoji sequences (skin tones, zero-width joiners, flags), CJK
characters split one by one, punctuation and digits split from words, whitespace and invisible
characters, texts refused as empty, texts cut at the model's length, and every signature boundary.
The list is fixed and ordered, so two bundles of one model carry the same cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    text: str
    pair: str | None = None


PLAIN = [
    "The battery died after two days.",
    "Great phone, fast delivery and friendly staff.",
    "I would not recommend this hotel to anyone.",
    "The film was long but the ending made it worth it.",
    "Service was slow, the food was cold, and nobody apologised.",
    "Absolutely loved it!",
    "it works",
    "Meh.",
    "Not bad at all, actually quite good.",
    "The screen is bright; the speakers are tinny.",
    "Delivery took three weeks and the box arrived crushed.",
    "Five stars for the camera, one star for the software updates.",
    "This is the best purchase I have made this year",
    "Terrible customer support, they hung up on me twice.",
    "A quiet room with a view of the harbour.",
    "The plot twists felt unearned and the dialogue was stiff.",
    "Works as described. Nothing more, nothing less.",
    "My kids can't stop playing with it.",
    "Returned it the next day.",
    "Surprisingly comfortable for such a cheap chair.",
    "good",
    "bad",
    "a",
    "The the the the the.",
    "unbelievably uncharacteristically antidisestablishmentarianism",
]

ACCENTS = [
    "Café crème and a crêpe, très bien!",
    "The naïve façade of the résumé",
    "Ångström, Øresund, Ærø",
    "São Paulo é incrível",
    "Zürich ist schön, die Straße ist groß",
    "STRASSE und Straße",
    "Dvořák's Symphony No. 9",
    "Łódź, Gdańsk, Kraków",
    "¿Qué tal? ¡Muy bien!",
    "El niño comió piñata",
    "İstanbul'da ılık bir gün",
    "ISTANBUL ıi İI",
    "Tiếng Việt có dấu",
    "Ελληνικά: Καλημέρα κόσμε",
    "Привет, мир! Отличный телефон.",
    "Ёлка и ёжик",
    "Čeština: příliš žluťoučký kůň",
    "Þórshöfn og Ísafjörður",
    "Crème brûlée (composed é)",
    "Cre\u0300me bru\u0302le\u0301e (decomposed e + combining accents)",
    "ﬁne ﬂour (ligatures)",
    "ª º ¹ ² ³ ½ ¼",
    "Ｆｕｌｌｗｉｄｔｈ ｌｅｔｔｅｒｓ １２３",
    "עברית מימין לשמאל",
    "العربية جميلة",
    "हिन्दी में लिखा",
    "ภาษาไทยไม่มีช่องว่าง",
]

EMOJI = [
    "Great phone 👍",
    "😂😂😂",
    "I ❤️ it",
    "I ❤ it",
    "Thumbs up 👍🏽 with a skin tone",
    "Family 👨‍👩‍👧‍👦 emoji with joiners",
    "Flags 🇫🇷 🇯🇵 🇧🇷",
    "🔥🔥 hot deal 🔥🔥",
    "Rating: ⭐⭐⭐⭐☆",
    "Keycap 1️⃣ 2️⃣ #️⃣",
    "sad :( happy :) wink ;-)",
    "¯\\_(ツ)_/¯",
    "🙃",
    "Mixed 🎉party🎉time",
    "♥ ☺ ✓ ✗ ★ ☆",
    "Math 𝔸𝕓𝕔 𝟙𝟚𝟛",
]

CJK = [
    "这部手机很好用",
    "電池の持ちが悪いです",
    "このホテルは最高でした！",
    "배터리가 빨리 닳아요",
    "服务很差，不推荐。",
    "iPhone 15 很贵",
    "東京タワーとスカイツリー",
    "カタカナとひらがな",
    "漢字、かな、カナ、English mixed",
    "中文，标点。符号！",
    "ＣＪＫ全角ＡＢＣ",
    "我爱北京天安门",
    "좋아요 👍 최고",
    "한국어와 English",
    "𠀀𠀁 (CJK extension B)",
    "〜ございます〜",
]

NUMBERS = [
    "$1,299.99 is too much",
    "€15, £20, ¥3000, ₹500",
    "3.14159265358979",
    "10/10 would buy again!!!",
    "Call 555-0100 or +44 20 7946 0958",
    "mail me at a.b@example.com",
    "https://example.com/path?q=1&lang=en#top",
    "(parentheses) [brackets] {braces} <angles>",
    "'single' \"double\" «guillemets» „low-high“ ‘curly’",
    "em—dash en–dash hyphen-ated",
    "1st 2nd 3rd 4th",
    "#hashtag @mention",
    "C++ & C# & F#",
    "50% off, 2x faster, 0.5mm",
    "2024-01-31T12:00:00Z",
    "...",
    "?!?!",
    "don't won't can't shouldn't've",
    "e.g. i.e. etc. U.S.A.",
    "1,000,000 and 1.000.000 and 1 000 000",
    "x = a*b + c/d - e^2",
    "path/to/file_name.txt and C:\\Users\\me",
    "~!@#$%^&*()_+`-=",
    "12345678901234567890",
    "v2.3.0-rc1",
]

CASE_VARIANTS = [
    ("upper", str.upper),
    ("lower", str.lower),
    ("title", str.title),
    ("swapcase", str.swapcase),
]

WHITESPACE = [
    "  leading and trailing spaces  ",
    "tabs\tbetween\twords",
    "line\nbreaks\nhere",
    "windows\r\nline ends",
    "many     spaces     between",
    "no\u00a0break\u00a0spaces",
    "ideographic\u3000space",
    "zero\u200bwidth\u200bspace",
    "soft\u00adhyphen",
    "word\u2028line separator",
    "\ufeffbyte order mark first",
    "control\x07bell\x1bescape",
    "\u200b",
]

EMPTY = ["", " ", "\t", "\n\n", "\u00a0", "\u3000", " \t\r\n "]
"""Texts the runner refuses (no character that is not whitespace to Python's ``str.strip``)."""

LONG_SENTENCE = (
    "The hotel room was clean and quiet, the staff at the front desk were friendly and quick, breakfast "
    "had fresh fruit and good coffee, but the wifi dropped every evening and the lift was out of order "
    "for two of the five days we stayed there. "
)
LONG = [
    LONG_SENTENCE * 3,
    LONG_SENTENCE * 12,
    "Café 👍 这部手机很好用 " * 60,
    "word " * 1000,
    " ".join(str(n) for n in range(400)),
    "!" * 500,
    "这" * 400,
]
LONG_WORDS = [
    "x" * 300,
    "supercalifragilisticexpialidocious" * 20,
    "😂" * 400,
    "a" * 100,
    "a" * 101,
]
"""Single words past WordPiece's max_input_chars_per_word (100 for BERT): one [UNK], not many pieces."""


def _numbered(category: str, texts: list[str]) -> list[Case]:
    return [Case(f"{category}-{i:03d}", category, text) for i, text in enumerate(texts)]


def _variants() -> list[Case]:
    cases = []
    for name, change in CASE_VARIANTS:
        for i, text in enumerate(PLAIN[:10] + ACCENTS[:10]):
            cases.append(Case(f"case-{name}-{i:03d}", "mixed-case", change(text)))
    return cases


def _mixed() -> list[Case]:
    """One text from each of three groups in one string: where a port switches between code paths."""
    cases = []
    for i in range(60):
        parts = [PLAIN[i % len(PLAIN)], EMOJI[i % len(EMOJI)], [CJK, ACCENTS, NUMBERS][i % 3][i % 16]]
        cases.append(Case(f"mixed-{i:03d}", "mixed", " ".join(parts[i % 3 :] + parts[: i % 3])))
    return cases


def boundary_texts(count: Callable[[str], int], lengths: list[int]) -> list[Case]:
    """Texts whose token count (special tokens included) is one under, at and one over each signature
    length, where the tokenizer allows it: the cases where a port picks the wrong signature."""
    cases = []
    for length in lengths:
        for target in (length - 1, length, length + 1):
            words = max(target - count(""), 0)
            while words and count(" ".join(["good"] * words)) > target:
                words -= 1
            text = " ".join(["good"] * words)
            if text and count(text) == target:
                cases.append(Case(f"boundary-{target:04d}", "signature-boundary", text))
    return cases


def single_cases() -> list[Case]:
    """Every single-text case, in a fixed order (boundary cases depend on the tokenizer: added apart)."""
    groups = [
        ("plain", PLAIN),
        ("accents", ACCENTS),
        ("emoji", EMOJI),
        ("cjk", CJK),
        ("numbers-punctuation", NUMBERS),
        ("whitespace", WHITESPACE),
        ("empty", EMPTY),
        ("long-truncated", LONG),
        ("long-word", LONG_WORDS),
    ]
    cases = [case for category, texts in groups for case in _numbered(category, texts)]
    return cases + _variants() + _mixed()


def pair_cases() -> list[Case]:
    """Sentence pairs for a model that classifies pairs: every single text beside another one (so each
    group meets the others), long beside short, short beside long, long beside long (truncation takes
    tokens from the longer text first), and an empty text on either side (refused)."""
    singles = [case for case in single_cases() if case.category != "empty"]
    shift = len(singles) // 3
    cases = [
        Case(f"pair-{i:03d}", f"pair:{a.category}+{b.category}", a.text, b.text)
        for i, (a, b) in enumerate(zip(singles, singles[shift:] + singles[:shift], strict=True))
    ]
    long, short = LONG[:4], PLAIN[:4]
    for i, (a, b) in enumerate(zip(long, short, strict=True)):
        cases.append(Case(f"pair-long-short-{i:03d}", "pair:long+short", a, b))
        cases.append(Case(f"pair-short-long-{i:03d}", "pair:short+long", b, a))
        cases.append(Case(f"pair-long-long-{i:03d}", "pair:long+long", a, long[-1 - i]))
    for i, empty in enumerate(EMPTY[:3]):
        cases.append(Case(f"pair-empty-first-{i:03d}", "pair:empty", empty, PLAIN[i]))
        cases.append(Case(f"pair-empty-second-{i:03d}", "pair:empty", PLAIN[i], empty))
    return cases
