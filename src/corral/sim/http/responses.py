"""Response bodies with vLLM's exact key order: completions, chat completions, their SSE chunks, model list.

Keys and nulls follow the captured vLLM 0.32 responses, so clients and conformance tests see the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class PromptCache:
    """What the prefix cache did for one prompt, for `prompt_tokens_details` (--enable-prompt-tokens-details):
    the tokens it served, and the tokens of the prompt's full blocks it newly holds."""

    cached_tokens: int
    created_cache_tokens: int


def _prompt_details(cache: PromptCache, chat: bool, stream: bool) -> dict[str, Any]:
    """vLLM 0.32's details, a miss included (`cached_tokens: 0`): a chat answer also says the tokens it
    added to the cache, a completion only null there; a stream's usage drops the nulls."""
    details: dict[str, Any] = {
        "cached_tokens": cache.cached_tokens,
        "created_cache_tokens": cache.created_cache_tokens if chat else None,
        "multimodal_tokens": None,
    }
    return {k: v for k, v in details.items() if v is not None} if stream else details


def _usage(
    prompt: int, completion: int, details: bool, cache: PromptCache | None, chat: bool
) -> dict[str, Any]:
    """vLLM's usage (`details`: a whole answer's, with its nulls; else a stream's usage event); `cache`
    with --enable-prompt-tokens-details: `prompt_tokens_details`."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details or cache is not None:
        usage["prompt_tokens_details"] = None if cache is None else _prompt_details(cache, chat, not details)
    if details:
        usage["completion_tokens_details"] = None
    return usage


def chat_completion(
    rid: str,
    created: int,
    model: str,
    fingerprint: str,
    text: str,
    finish: str,
    stop_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    kv_transfer_params: dict[str, Any] | None = None,
    cache: PromptCache | None = None,
) -> bytes:
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": _usage(prompt_tokens, completion_tokens, True, cache, chat=True),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def text_completion(
    rid: str,
    created: int,
    model: str,
    fingerprint: str,
    text: str,
    finish: str,
    stop_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    kv_transfer_params: dict[str, Any] | None = None,
    cache: PromptCache | None = None,
) -> bytes:
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": _usage(prompt_tokens, completion_tokens, True, cache, chat=False),
            "kv_transfer_params": kv_transfer_params,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


class StreamEncoder:
    """SSE events of one streamed chat or text completion; the per-token event is byte concatenation only."""

    def __init__(self, chat: bool, rid: str, created: int, model: str, fingerprint: str) -> None:
        self.chat = chat
        self._rid, self._created, self._model, self._fingerprint = rid, created, model, fingerprint
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            b'data: {"id":'
            + orjson.dumps(rid)
            + b',"object":"'
            + obj.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":['
        )
        if chat:
            self._delta_open = b'{"index":0,"delta":{"content":'
            self._delta_close = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        else:
            self._delta_open = b'{"index":0,"text":'
            self._delta_close = (
                b',"logprobs":null,"finish_reason":null,"stop_reason":null,'
                b'"prompt_token_ids":null,"token_ids":null}]}\n\n'
            )

    def _event(self, payload: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self._rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }

    def role(self) -> bytes:
        """The chat stream's first event: the assistant role with empty content."""
        payload = self._base(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        payload["prompt_token_ids"] = None
        payload["prompt_text"] = None
        return self._event(payload)

    def delta(self, text: str) -> bytes:
        return self._head + self._delta_open + orjson.dumps(text) + self._delta_close

    def last(self, text: str, finish: str, stop_reason: str | None, with_fingerprint: bool) -> bytes:
        """The event carrying the last token and the finish reason."""
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        payload = self._base([choice])
        if with_fingerprint and self.chat:
            payload["system_fingerprint"] = self._fingerprint
        return self._event(payload)

    def usage(self, prompt_tokens: int, completion_tokens: int, cache: PromptCache | None = None) -> bytes:
        payload = self._base([])
        payload["usage"] = _usage(prompt_tokens, completion_tokens, False, cache, self.chat)
        payload["system_fingerprint"] = self._fingerprint
        return self._event(payload)


def _permission(perm_id: str, created: int) -> dict[str, Any]:
    return {
        "id": perm_id,
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def _card(
    name: str, root: str, parent: str | None, created: int, max_model_len: int | None, perm_id: str
) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [_permission(perm_id, created)],
    }


def model_list(
    model: str,
    root: str,
    created: int,
    max_model_len: int,
    perm_id: str,
    adapters: Sequence[tuple[str, str, str, int, str]] = (),
) -> bytes:
    """The base model, then each LoRA adapter `(name, path, base model, created, permission id)`; as in
    vLLM, an adapter's card has `root` = its path, `parent` = the base model and no `max_model_len`."""
    cards = [_card(model, root, None, created, max_model_len, perm_id)]
    cards += [_card(name, path, base, when, None, perm) for name, path, base, when, perm in adapters]
    return orjson.dumps({"object": "list", "data": cards})
