"""Prefix holders answered from the KV index: the share of a prompt's leading blocks each endpoint
holds, computed from the prompt's tokens as `corral sim` tokenizes them; endpoints without events
answered by the approximate memory; a pick held as pending until the events confirm it."""

from __future__ import annotations

from corral.engine.kv_events import block_hashes
from corral.engine.sim_chat import render_chat
from corral.engine.sim_tokenizer import ToyTokenizer
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.kv_holders import KvPrefixHolders
from corral.router.routing.kv_index import KvIndex
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.prompt_tokens import SimPromptTokens, prompt_tokens
from corral.router.routing.request import RouteRequest

BS = 16
SYSTEM = "You are a careful assistant. " * 40


def _request(question: str) -> RouteRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return RouteRequest("m", {}, {"model": "m", "messages": messages})


def _engine_tokens(question: str) -> list[int]:
    """What `corral sim` prefills for the same body."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return ToyTokenizer().encode(render_chat(messages))


def _endpoint(name: str) -> Endpoint:
    return Endpoint(f"http://{name}:8000", state=EngineState.READY)


def _holders(publishing: set[str]) -> tuple[KvPrefixHolders, KvIndex, PrefixMemory]:
    index = KvIndex()
    memory = PrefixMemory()
    return KvPrefixHolders(index, SimPromptTokens(), publishing.__contains__, memory), index, memory


def test_the_share_held_follows_the_engines_events() -> None:
    a, b = _endpoint("a"), _endpoint("b")
    holders, index, _ = _holders({a.url, b.url})
    tokens = _engine_tokens("What is a cache?")
    hashes = block_hashes(tokens, BS, seed="x")
    index.stored(a.url, hashes, None, tokens[: len(hashes) * BS], BS)
    half = len(hashes) // 2
    index.stored(b.url, hashes[:half], None, tokens[: half * BS], BS)
    shares = holders.held(_request("What is a cache?"), [a, b])
    assert shares[0] == 1.0
    assert shares[1] == half / len(hashes)
    # another question after the same system prompt: the shared blocks still count
    other = holders.held(_request("Name a river."), [a, b])
    assert 0.5 < other[0] < 1.0 and other[1] < other[0]


def test_holders_come_deepest_first() -> None:
    """A pick on a large fleet scores only the first few holders: the ones holding most come first,
    whatever order the engines' events arrived in."""
    shallow, middle, deep = _endpoint("s"), _endpoint("m"), _endpoint("d")
    holders, index, _ = _holders({shallow.url, middle.url, deep.url})
    tokens = _engine_tokens("What is a cache?")
    hashes = block_hashes(tokens, BS, seed="x")
    for endpoint, count in ((shallow, 2), (middle, len(hashes) // 2), (deep, len(hashes))):
        index.stored(endpoint.url, hashes[:count], None, tokens[: count * BS], BS)
    assert list(holders.holders(_request("What is a cache?")))[:3] == [deep.url, middle.url, shallow.url]


def test_endpoints_without_events_are_answered_by_the_memory() -> None:
    a, b = _endpoint("a"), _endpoint("b")
    holders, index, memory = _holders({a.url})
    index.watch(a.url)
    request = _request("What is a cache?")
    memory.sent(request, b)
    assert holders.held(_request("What is a cache?"), [a, b]) == [0.0, 1.0]


def test_a_pick_is_held_as_pending_until_the_events_come() -> None:
    a, b = _endpoint("a"), _endpoint("b")
    holders, index, _ = _holders({a.url, b.url})
    tokens = _engine_tokens("seed")
    hashes = block_hashes(tokens, BS, seed="x")
    index.watch(a.url)
    index.stored(b.url, hashes[:1], None, tokens[:BS], BS)  # the block size is known
    request = _request("What is a cache?")
    holders.sent(request, a)
    shares = holders.held(_request("What is a cache?"), [a, b])
    assert shares[0] == 1.0 and shares[1] < 1.0


def test_a_prompt_without_tokens_holds_nothing_anywhere() -> None:
    a = _endpoint("a")
    holders, index, _ = _holders({a.url})
    index.stored(a.url, [1], None, list(range(BS)), BS)
    assert holders.held(RouteRequest("m", {}, None), [a]) == [0.0]
    assert holders.held(RouteRequest("m", {}, {"prompt": ["x", "y"]}), [a]) == [0.0]


def test_prompts_given_as_token_ids_are_taken_as_they_are() -> None:
    tokens = SimPromptTokens()
    assert tokens.tokens({"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert tokens.tokens({"prompt": [[5, 6]]}) == [5, 6]
    assert tokens.tokens({"prompt": "hi"}) == ToyTokenizer().encode("hi")
    assert prompt_tokens(None) is None


def test_an_engine_that_evicted_the_tail_of_a_prompt_sent_to_it_stays_its_holder() -> None:
    """Partial eviction is not a reason to place a prompt anew: where this router sent all of it and
    the engine still holds its start, the memory's share stands (the next request there recomputes the
    tail only). An engine that holds the start only because another prompt shares it, or one that evicted
    all of it, is answered by the events alone."""
    home, other, emptied = _endpoint("home"), _endpoint("other"), _endpoint("emptied")
    holders, index, memory = _holders({home.url, other.url, emptied.url})
    question = "What is a cache?"
    tokens = _engine_tokens(question)
    hashes = block_hashes(tokens, BS, seed="x")
    for endpoint in (home, other, emptied):
        index.stored(endpoint.url, hashes, None, tokens[: len(hashes) * BS], BS)
    memory.sent(_request(question), home)
    memory.sent(_request(question), emptied)
    half = len(hashes) // 2
    index.removed(home.url, hashes[half:])  # the tail evicted on both
    index.removed(other.url, hashes[half:])
    index.removed(emptied.url, hashes)  # all of it
    shares = holders.held(_request(question), [home, other, emptied])
    assert shares[0] == 1.0
    assert shares[1] == half / len(hashes)
    assert shares[2] == 0.0
