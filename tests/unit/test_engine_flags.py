from corral.engine.flags import api_key_values, engine_api_key, serving_settings


def test_last_occurrence_wins_in_both_spellings() -> None:
    argv = ["vllm", "serve", "org/m", "--dtype", "half", "--dtype=bfloat16", "-tp", "2", "--enable-lora"]
    assert serving_settings(argv) == {
        "model": "org/m",
        "dtype": "bfloat16",
        "tensor_parallel_size": "2",
        "lora": True,
    }
    assert serving_settings(["--model=a", "--port", "8000", "--model", "b"]) == {"model": "b"}


def test_api_key_rule_last_flag_then_environment() -> None:
    assert engine_api_key(["--api-key", "a", "--api-key=b"], {}) == "b"
    assert engine_api_key(["--api-key", "x", "y", "--port", "1"], {}) == "x"
    assert api_key_values(["--api-key", "x", "y", "--port", "1"]) == ["x", "y"]
    assert engine_api_key([], {"VLLM_API_KEY": "env"}) == "env"
    assert engine_api_key(["--api-key="], {"VLLM_API_KEY": "env"}) is None  # a given flag wins, even empty
    assert api_key_values(["--port", "1"]) is None
