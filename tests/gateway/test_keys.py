"""Tests for dankserve.gateway.keys: key files parsed, names validated, scopes, constant-time lookup."""

from __future__ import annotations

import pytest

from dankserve.gateway.keys import Key, KeyFileError, KeyRing, bearer, key_name, parse_key

SECRET = "sk-0123456789abcdef"
MANY_GLOBS = ", ".join(['"a"'] * 300)


def no_file(path: str) -> str:
    raise AssertionError(f"no key_file expected, asked for {path}")


def test_a_full_key_file_is_parsed() -> None:
    """Every setting of a key file lands in the Key; models default to everything."""
    text = (
        f'key = "{SECRET}"\nmodels = ["qwen*", "gpt-4o-mini"]\nrequests_per_minute = 60\n'
        "tokens_per_minute = 1000\nmax_concurrent = 2\npriority = 5\n"
    )
    key = parse_key("alice", text, no_file)
    assert key == Key("alice", SECRET, ("qwen*", "gpt-4o-mini"), 60, 1000, 2, 5)
    assert parse_key("bob", f'key = "{SECRET}"', no_file).models == ("*",)


def test_key_file_is_read_through_the_given_reader() -> None:
    """`key_file` names an absolute path, read by the shell's reader, its whitespace stripped."""
    key = parse_key("carol", 'key_file = "/etc/k"', lambda path: f"  {SECRET}\n" if path == "/etc/k" else "")
    assert key.secret == SECRET
    with pytest.raises(KeyFileError, match="absolute path"):
        parse_key("carol", 'key_file = "k"', no_file)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "set one of"),
        (f'key = "{SECRET}"\nkey_file = "/k"', "set one of"),
        ('key = "short"', "characters long"),
        ('key = "sk-ünïcödé-0123456789"', "printable ASCII"),
        ('key = "sk 0123456789 abcdef"', "printable ASCII"),
        (f'key = "{"x" * 5000}"', "characters long"),
        (f'key = "{SECRET}"\nmodels = "*"', "list of name globs"),
        (f'key = "{SECRET}"\nmodels = [""]', "list of name globs"),
        (f'key = "{SECRET}"\nrequests_per_minute = 0', "whole number"),
        (f'key = "{SECRET}"\nmax_concurrent = true', "whole number"),
        (f'key = "{SECRET}"\npriority = 10000', "priority"),
        (f'key = "{SECRET}"\nrpm = 3', "unknown setting 'rpm'"),
        ("key = [", "not TOML"),
        (f'key = "{SECRET}"\nmodels = [{MANY_GLOBS}]', "at most 256"),
    ],
)
def test_bad_key_files_are_refused_naming_the_problem(text: str, problem: str) -> None:
    """A key file that is not what it must be: KeyFileError saying what is wrong."""
    with pytest.raises(KeyFileError, match=problem):
        parse_key("k", text, no_file)


@pytest.mark.parametrize("name", ["Alice.toml", "-x.toml", ".toml", "a b.toml", "é.toml", "a" * 64 + ".toml", "x.txt"])
def test_key_names_are_plain(name: str) -> None:
    """A key's name goes into logs and metric labels: lowercase ASCII, digits, _ . -, at most 63."""
    with pytest.raises(KeyFileError):
        key_name(name)
    assert key_name("team-a_1.x.toml") == "team-a_1.x"


def test_scopes_are_globs_over_the_name_sent() -> None:
    """`models` globs match case-sensitively, any of them."""
    key = Key("k", SECRET, ("qwen*", "gpt-4o-mini"))
    assert key.allows(["qwen3"]) and key.allows(["gpt-4o-mini"])
    assert not key.allows(["Qwen3"]) and not key.allows(["llama"]) and not key.allows([])


def test_the_ring_finds_the_key_and_never_a_wrong_one() -> None:
    """identify() returns the key holding the secret, None for anything else (prefixes, empty, unicode)."""
    ring = KeyRing((Key("a", SECRET), Key("b", SECRET + "-b")))
    assert ring.identify(SECRET).name == "a"  # type: ignore[union-attr]
    assert ring.identify(SECRET + "-b").name == "b"  # type: ignore[union-attr]
    for wrong in ("", SECRET[:-1], SECRET + "x", "é" * 20, "\udcff"):
        assert ring.identify(wrong) is None
    assert ring.required and not KeyRing().required and KeyRing(required=True).required


def test_the_ring_refuses_duplicates() -> None:
    """Two keys with one name or one secret cannot be told apart: refused."""
    with pytest.raises(KeyFileError, match="one name"):
        KeyRing((Key("a", SECRET), Key("a", SECRET + "x")))
    with pytest.raises(KeyFileError, match="same secret"):
        KeyRing((Key("a", SECRET), Key("b", SECRET)))


def test_the_secret_is_not_in_repr() -> None:
    """A Key logged by mistake shows its name, not its secret."""
    assert SECRET not in repr(Key("a", SECRET)) and SECRET not in repr(KeyRing((Key("a", SECRET),)))


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        (["Bearer abc"], "abc"),
        (["bearer abc"], "abc"),
        (["BEARER   abc  "], "abc"),
        ([], None),
        (["Bearer abc", "Bearer def"], None),
        (["Basic abc"], None),
        (["Bearer"], None),
        (["Bearer a b"], None),
        (["abc"], None),
    ],
)
def test_bearer_takes_exactly_one_bearer_header(headers: list[str], token: str | None) -> None:
    """One Authorization header with the Bearer scheme (any case); none, several or another scheme: no token."""
    assert bearer(headers) == token


def test_identify_compares_with_every_key_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: a match on the first key, on the last, or none makes as many comparisons, of equal length."""
    import hmac

    ring = KeyRing(tuple(Key(f"k{i}", f"{SECRET}-{i:03d}{'x' * i}") for i in range(20)))
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for offered in (f"{SECRET}-000", f"{SECRET}-019{'x' * 19}", "nothing-like-it", "é" * 300):
        compared.clear()
        ring.identify(offered)
        assert compared == [(32, 32)] * 20, offered
