"""Text and a tokenizer made here, for the frameworks' scripts: nothing is downloaded.

Imported by the scripts beside it, in each framework's own environment (each
has the ``tokenizers`` package).  The sentences are the same on every run.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

WORDS = (
    "the a model shard rank gradient memory layer weight step loss batch token train run device host "
    "small large fast slow holds splits gathers reduces saves loads each every one two eight"
).split()
UNKNOWN = "<unk>"


def sentence(i: int, length: int) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(length))


def sentences(count: int, shortest: int = 5, spread: int = 9) -> list[str]:
    """``count`` sentences of the vocabulary, of lengths ``shortest`` to ``shortest + spread - 1``."""
    return [sentence(i, shortest + i % spread) for i in range(count)]


def word_level(specials: tuple[str, ...]) -> Tokenizer:
    """A word-level tokenizer of ``specials`` (first, in order), ``<unk>`` and the vocabulary."""
    names = [*specials, *(() if UNKNOWN in specials else (UNKNOWN,)), *WORDS]
    tokenizer = Tokenizer(WordLevel(vocab={word: i for i, word in enumerate(names)}, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer
