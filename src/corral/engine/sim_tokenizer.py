"""How `corral sim` tokenizes: a deterministic toy tokenizer, text to token ids and back, no model files
needed. A fact about that engine, below both its readers: the simulator tokenizes with it, and the
router's `--tokenizer sim` computes the same ids to key prefix blocks as the engine's KV events do.

The vocabulary is fixed: special tokens, 256 byte-fallback tokens, every printable ASCII character and
character pair, and a list of short English words. Tokenizing is greedy longest-match over pre-tokens
(a word with its leading space, a number, punctuation, whitespace), so no token is longer than 6
characters and vLLM's character pre-check (`max_model_len * 6`) stays a true upper bound.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
_BYTE_BASE = 3
MAX_TOKEN_CHARS = 6
_MEMO_LIMIT = 65536

WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "hot",
    "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up",
    "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will",
    "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her", "long",
    "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come", "did",
    "sound", "no", "most", "who", "over", "know", "water", "than", "call", "first", "may", "down",
    "side", "been", "now", "find", "any", "new", "work", "part", "take", "get", "place", "made",
    "live", "where", "after", "back", "little", "only", "round", "man", "year", "came", "show",
    "every", "good", "me", "give", "our", "under", "name", "very", "through", "just", "form", "much",
    "great", "think", "say", "help", "low", "line", "turn", "cause", "same", "mean", "move", "right",
    "boy", "old", "too", "does", "tell", "set", "three", "want", "air", "well", "also", "play",
    "small", "end", "put", "home", "read", "hand", "port", "large", "spell", "add", "even", "land",
    "here", "must", "big", "high", "such", "act", "why", "ask", "men", "went", "light", "kind",
    "off", "need", "house", "try", "us", "again", "animal", "point", "world", "near", "build",
    "self", "earth", "father", "head", "stand", "own", "page", "should", "found", "answer", "school",
    "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four", "state", "keep",
    "eye", "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start",
    "might", "story", "saw", "far", "sea", "draw", "left", "late", "run", "while", "press", "close",
    "night", "real", "life", "few", "north", "open", "seem", "model", "cache", "token", "queue",
)  # fmt: skip

_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")


def _build_vocab() -> list[str]:
    pieces = ["<unk>", "<s>", "</s>"]
    pieces.extend(f"<0x{b:02X}>" for b in range(256))
    printable = [chr(c) for c in range(32, 127)]
    pieces.extend(["\n", "\t", "\n\n", "  ", "    "])
    pieces.extend(printable)
    pieces.extend(a + b for a in printable for b in printable)
    seen = set(pieces)
    for word in WORDS:
        for form in (word, " " + word, word.capitalize(), " " + word.capitalize()):
            if len(form) <= MAX_TOKEN_CHARS and form not in seen:
                seen.add(form)
                pieces.append(form)
    return pieces


class ToyTokenizer:
    """Greedy longest-match tokenizer over a fixed vocabulary with UTF-8 byte fallback."""

    def __init__(self) -> None:
        self._pieces: list[str] = _build_vocab()
        self._ids: dict[str, int] = {p: i for i, p in enumerate(self._pieces) if i >= _BYTE_BASE + 256}
        # Pre-tokens repeat a lot (words); remembering their split keeps encode to a dict hit per word.
        self._memo: dict[str, tuple[int, ...]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        vocab, memo = self._ids, self._memo
        for pre in _PRETOKEN.findall(text):
            tid = vocab.get(pre)
            if tid is not None:
                ids.append(tid)
                continue
            split = memo.get(pre)
            if split is None:
                split = self._split(pre)
                if len(pre) <= 64:
                    if len(memo) >= _MEMO_LIMIT:
                        memo.clear()
                    memo[pre] = split
            ids.extend(split)
        return ids

    def _split(self, pre: str) -> tuple[int, ...]:
        """Greedy longest match of one pre-token, UTF-8 bytes for characters outside the vocabulary."""
        vocab = self._ids
        ids: list[int] = []
        i, n = 0, len(pre)
        while i < n:
            for length in range(min(MAX_TOKEN_CHARS, n - i), 0, -1):
                tid = vocab.get(pre[i : i + length])
                if tid is not None:
                    ids.append(tid)
                    i += length
                    break
            else:
                ids.extend(_BYTE_BASE + b for b in pre[i].encode("utf-8"))
                i += 1
        return tuple(ids)

    def decode(self, ids: Sequence[int]) -> str:
        pieces = self._pieces
        out: list[str] = []
        pending = bytearray()
        for tid in ids:
            if _BYTE_BASE <= tid < _BYTE_BASE + 256:
                pending.append(tid - _BYTE_BASE)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if _BYTE_BASE + 256 <= tid < len(pieces):
                out.append(pieces[tid])
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [self._pieces[t] if 0 <= t < len(self._pieces) else "<unk>" for t in ids]
