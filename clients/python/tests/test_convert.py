"""from_openai and from_anthropic against recorded provider responses
(clients/testdata/providers)."""

from __future__ import annotations

import json
import os
import unittest
from typing import Any

from overage import from_anthropic, from_openai

PROVIDERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "providers")


def load(name: str) -> Any:
    with open(os.path.join(PROVIDERS, name), encoding="utf-8") as f:
        return json.load(f)


EXPECTED = load("expected.json")


class SDKObject:
    """An SDK response object: pydantic's model_dump."""

    def __init__(self, d: Any) -> None:
        self._d = d

    def model_dump(self) -> Any:
        return self._d


class ConvertTest(unittest.TestCase):
    def test_openai(self) -> None:
        for name in ("openai_chat_completion.json", "openai_stream_final_chunk.json"):
            with self.subTest(name):
                self.assertEqual(from_openai(load(name)), EXPECTED[name])
                self.assertEqual(from_openai(SDKObject(load(name))), EXPECTED[name])

    def test_openai_chunk_without_usage_says_how_to_get_it(self) -> None:
        with self.assertRaisesRegex(ValueError, "include_usage"):
            from_openai(load("openai_stream_chunk_without_usage.json"))

    def test_openai_responses_api(self) -> None:
        r = {"id": "resp_1", "model": "o3", "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 10},
                                                     "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 30}}}
        self.assertEqual(from_openai(r), {"request_id": "resp_1", "model_id": "o3", "input_tokens": 50, "output_tokens": 40,
                                          "cache_read_input_tokens": 10, "reasoning_output_tokens": 30})

    def test_anthropic(self) -> None:
        for name in ("anthropic_message.json", "anthropic_message_start.json"):
            with self.subTest(name):
                self.assertEqual(from_anthropic(load(name)), EXPECTED[name])
                self.assertEqual(from_anthropic(SDKObject(load(name))), EXPECTED[name])

    def test_anthropic_stream(self) -> None:
        got = from_anthropic(load("anthropic_message_delta.json"), message_start=load("anthropic_message_start.json"))
        self.assertEqual(got, EXPECTED["anthropic_message_delta.json after anthropic_message_start.json"])
        with self.assertRaisesRegex(ValueError, "message_start"):
            from_anthropic(load("anthropic_message_delta.json"))

    def test_bad_counts_are_refused(self) -> None:
        with self.assertRaises(ValueError):
            from_openai({"id": "x", "model": "m", "usage": {"prompt_tokens": "12", "completion_tokens": 1}})
        with self.assertRaises(TypeError):
            from_openai(42)


if __name__ == "__main__":
    unittest.main()
