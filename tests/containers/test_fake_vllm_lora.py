"""Tests for the stand-in's LoRA adapters (containers/fake-vllm/fake_vllm/lora.py): argv, listing, completions and
vLLM 0.26's runtime load/unload routes with its codes and messages."""

from __future__ import annotations

import json
from pathlib import Path

from tests.containers.test_fake_vllm import MODEL, StartServer, base_env, free_port, http, run_to_exit, serve

__all__ = ["serve"]  # the fixture, used by name


def adapter(root: Path, rank: int = 8) -> str:
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    return str(root)


def token_ids(url: str, model: str) -> tuple[int, list[int]]:
    status, body = http(url, "POST", {"model": model, "prompt": "x", "max_tokens": 3, "return_token_ids": True})
    return status, json.loads(body)["choices"][0]["token_ids"] if status == 200 else []


def test_adapters_at_boot_are_listed_with_their_parent_and_answer_with_other_ids(
    serve: StartServer, tmp_path: Path
) -> None:
    """--lora-modules name=path: /v1/models lists the adapter with parent = the base; its ids differ from the base's."""
    sql = adapter(tmp_path / "sql")
    served = serve("--enable-lora", "--max-loras", "2", "--lora-modules", f"sql={sql}", env=base_env(tmp_path))
    served.wait_ready()
    assert f"Loaded new LoRA adapter: name 'sql', path '{sql}'" in served.stdout
    listed = json.loads(http(served.url("/v1/models"))[1])["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in listed] == [(MODEL, None, MODEL), ("sql", MODEL, sql)]
    base, lora = token_ids(served.url("/v1/completions"), MODEL), token_ids(served.url("/v1/completions"), "sql")
    assert base[0] == lora[0] == 200 and base[1] != lora[1]
    assert token_ids(served.url("/v1/completions"), "sql") == lora  # deterministic
    assert http(served.url("/v1/load_lora_adapter"), "POST", {"lora_name": "x", "lora_path": sql})[0] == 404


def test_a_static_adapter_that_fails_to_load_stops_the_server(tmp_path: Path) -> None:
    """A missing directory, a rank above --max-lora-rank or no --enable-lora: vLLM's message, exit 1."""
    wide = adapter(tmp_path / "wide", rank=32)
    cases = [
        (["--enable-lora", "--lora-modules", "a=/absent"], "Loading lora a failed: No adapter found for /absent"),
        (["--enable-lora", "--lora-modules", f"a={wide}"], "LoRA rank 32 is greater than max_lora_rank 16."),
        (["--lora-modules", f"a={wide}"], "LoRA is not enabled. Use --enable-lora to enable LoRA."),
    ]
    for args, message in cases:
        done = run_to_exit(["serve", MODEL, "--port", str(free_port()), *args], base_env(tmp_path))
        assert done.returncode == 1 and message in done.stderr, done.stderr


def test_bad_lora_argv_is_refused_like_vllm(tmp_path: Path) -> None:
    """A rank outside vLLM's choices and an unreadable --lora-modules item: argparse's exit 2."""
    done = run_to_exit(["serve", MODEL, "--enable-lora", "--max-lora-rank", "12"], base_env(tmp_path))
    assert done.returncode == 2 and "argument --max-lora-rank: invalid choice: 12" in done.stderr
    done = run_to_exit(["serve", MODEL, "--enable-lora", "--lora-modules", "a=b=c"], base_env(tmp_path))
    assert done.returncode == 2 and "Invalid fields for --lora-modules: a=b=c" in done.stderr


def test_runtime_load_and_unload_answer_like_vllm(serve: StartServer, tmp_path: Path) -> None:
    """With VLLM_ALLOW_RUNTIME_LORA_UPDATING: load (200 text, 400 twice, 404 missing, 500 rank), unload (200, 404)."""
    sql, wide = adapter(tmp_path / "sql"), adapter(tmp_path / "wide", rank=64)
    served = serve("--enable-lora", env=base_env(tmp_path, VLLM_ALLOW_RUNTIME_LORA_UPDATING="true"))
    served.wait_ready()
    assert "LoRA dynamic loading & unloading is enabled in the API server." in served.stdout
    load, unload = served.url("/v1/load_lora_adapter"), served.url("/v1/unload_lora_adapter")
    assert http(load, "POST", {"lora_name": "sql", "lora_path": sql}) == (
        200,
        b"Success: LoRA adapter 'sql' added successfully.",
    )
    again = http(load, "POST", {"lora_name": "sql", "lora_path": sql})
    assert again[0] == 400 and json.loads(again[1])["error"]["type"] == "InvalidUserInput"
    assert http(load, "POST", {"lora_name": "sql", "lora_path": sql, "load_inplace": True})[0] == 200
    missing = json.loads(http(load, "POST", {"lora_name": "m", "lora_path": "/absent"})[1])["error"]
    assert missing == {
        "message": "Loading lora m failed: No adapter found for /absent",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    rank = http(load, "POST", {"lora_name": "w", "lora_path": wide})
    assert rank[0] == 500 and b"LoRA rank 64 is greater than max_lora_rank 16." in rank[1]
    assert http(load, "POST", {"lora_name": "", "lora_path": sql})[0] == 400
    assert http(load, "POST", {"lora_path": sql})[0] == 422
    assert token_ids(served.url("/v1/completions"), "sql")[0] == 200
    assert http(unload, "POST", {"lora_name": "sql"}) == (200, b"Success: LoRA adapter 'sql' removed successfully.")
    gone = json.loads(http(unload, "POST", {"lora_name": "sql"})[1])["error"]
    assert gone["code"] == 404 and gone["message"] == "The lora adapter 'sql' cannot be found."
    assert token_ids(served.url("/v1/completions"), "sql")[0] == 404
