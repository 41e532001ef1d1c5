"""The benchmark's deterministic texts, and varied sample sentences (also the tests' sentences)."""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no what up out who them some "
    "could more into time only new about than other then these two may first any like now my such make over "
    "system model vector search query document latency throughput batch token server engine embedding"
).split()


def make_texts(kind: str, n: int, seed: int = 0) -> list[str]:
    """Deterministic texts: short ≈ 13 tokens, long ≈ 130 tokens, mixed: 4–250 tokens (log-uniform)."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "short":
        lengths = [10] * n
    elif kind == "long":
        lengths = [125] * n
    elif kind == "mixed":
        lengths = [int(round(2 ** rng.uniform(2, 7.9))) for _ in range(n)]
    else:
        raise SystemExit(f"unknown text kind {kind!r}")
    return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]


# ---- varied sentences: short, long (past the 256-token limit), punctuation, non-ASCII, empty-ish ----------

LONG = " ".join(
    f"Sentence number {i} talks about distributed systems, batching, tokenizers and latency budgets."
    for i in range(40)
)  # ≈ 700 tokens: truncates at MiniLM's 256

SENTENCES = [
    "The cat sits on the mat.",
    "A feline rests on a rug.",
    "Quantum chromodynamics describes the strong interaction.",
    "How do I reset my password?",
    "I forgot my login credentials, what should I do?",
    "Stock markets fell sharply on Tuesday.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Machine learning models need careful evaluation.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le café est très chaud ce matin.",
    "¿Dónde está la biblioteca?",
    "東京は日本の首都です。",
    "北京是中国的首都。",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "😀 emojis 🚀 and symbols ©®™",
    "a",
    "?",
    "   leading and trailing spaces   ",
    "UPPER CASE SENTENCE WITH NUMBERS 12345",
    "mixed-case CamelCaseWords and snake_case_words",
    "URLs like https://example.com/path?q=1 and emails like a@b.co",
    "Tabs\tand\nnewlines\nin the text",
    "A very short one.",
    "Photosynthesis converts light energy into chemical energy.",
    "The mitochondria is the powerhouse of the cell.",
    "Python is a popular programming language.",
    "Rust guarantees memory safety without garbage collection.",
    "The Eiffel Tower is located in Paris.",
    "Mount Everest is the highest mountain on Earth.",
    "She sells sea shells by the sea shore.",
    "To be or not to be, that is the question.",
    "The quick brown fox jumps over the lazy dog.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "Embeddings map text to vectors in a semantic space.",
    "Rerankers score query and document pairs jointly.",
    "Serverless functions scale to zero when idle.",
    "GPUs accelerate matrix multiplications.",
    "Inferentia chips are designed for inference workloads.",
    "Football is the most popular sport in the world.",
    "The weather today is sunny with a light breeze.",
    "Bananas are an excellent source of potassium.",
    "The library opens at nine in the morning.",
    "He plays the violin beautifully.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Économie, société et culture en Europe.",
    "Ñandú y pingüino en la Patagonia.",
    "Ελληνικά γράμματα: αλφα, βήτα, γάμμα.",
    "한국어 문장도 포함됩니다.",
    LONG,
    LONG[::-1],
    "word " * 300,
    "Numbers: 3.14159 2.71828 1.41421 and dates 2026-12-02.",
    "Code: def f(x): return x ** 2",
]
