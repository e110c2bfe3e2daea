"""The toy tokenizer: round trips, the 6-characters-per-token bound, determinism."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.engine.sim_chat import render_chat
from corral.engine.sim_tokenizer import MAX_TOKEN_CHARS, ToyTokenizer

TOK = ToyTokenizer()


@given(st.text(max_size=300))
def test_round_trip_and_char_bound(text: str) -> None:
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    # vLLM rejects prompts longer than max_model_len * 6 characters before tokenizing; that check is only
    # sound if no token covers more than 6 characters, i.e. len(text) <= 6 * len(ids).
    assert len(text) <= MAX_TOKEN_CHARS * len(ids)


def test_common_words_are_single_tokens() -> None:
    assert len(TOK.encode(" the")) == 1
    assert len(TOK.encode("hello world, the cat")) < len("hello world, the cat")


def test_encoding_is_deterministic_across_instances() -> None:
    text = "Deterministic tokens: 12345 ünïcödé 🙂"
    assert ToyTokenizer().encode(text) == TOK.encode(text)


def test_invalid_utf8_bytes_decode_to_replacement_char_like_vllm() -> None:
    ids = TOK.encode("é")  # two byte tokens
    assert len(ids) == 2
    assert TOK.decode(ids[:1]) == "\ufffd"


def test_chat_template_keeps_message_order() -> None:
    prompt = render_chat(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "first"}]},
            {"role": "assistant", "content": "second"},
            {"role": "user", "content": "third"},
        ]
    )
    positions = [prompt.index(s) for s in ("be brief", "first", "second", "third")]
    positions.append(prompt.rindex("<|assistant|>\n"))
    assert positions == sorted(positions)
    assert prompt.endswith("<|assistant|>\n")
