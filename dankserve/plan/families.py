"""The model's own serving flags: reasoning and tool-call parsers of known model families.

vLLM parses a model's thinking and tool calls only when told which parser fits it
(`--reasoning-parser`, `--tool-call-parser` with `--enable-auto-tool-choice`). The parser
names are vLLM's registered ones (vllm/reasoning/__init__.py, vllm/entrypoints/openai/
tool_parsers/__init__.py); each flag is proposed only where the release has it (catalogue),
and each is switched off by `reasoning_parser = "off"` / `tool_call_parser = "off"`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dankserve.plan.catalogue import VllmCapabilities
from dankserve.plan.models import ModelFacts

OFF = "off"


@dataclass(frozen=True)
class Family:
    """The parsers a model family's chat template speaks."""

    label: str
    reasoning: str | None
    tools: str | None


def family_of(model: ModelFacts) -> Family | None:
    """The family of a model by its config's model_type and its id (None: not known to dankserve).

    Without a config (facts declared by hand) the id alone decides: `Qwen/Qwen3-8B` is Qwen3.
    """
    name = model.model.lower()
    kind = (model.model_type or _type_from_id(name)).lower()
    if kind in ("qwen3", "qwen3_moe"):
        tools = "qwen3_coder" if "coder" in name else "hermes"
        reasoning = None if "instruct-2507" in name or "coder" in name else "qwen3"
        return Family("Qwen3", reasoning, tools)
    if kind in ("qwen2", "qwen2_moe"):
        return Family("Qwen2.5", None, "hermes")
    if kind in ("deepseek_v3",) and "r1" in name:
        return Family("DeepSeek-R1", "deepseek_r1", None)
    if kind == "llama" and any(v in name for v in ("llama-3.1", "llama-3.2", "llama-3.3")) and "instruct" in name:
        return Family("Llama 3.1+ Instruct", None, "llama3_json")
    return None


def _type_from_id(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    for prefix, kind in (
        ("qwen3-", "qwen3"),  # not Qwen3.5/3.6: their parsers are not known to dankserve
        ("qwen2-", "qwen2"),
        ("qwen2.5-", "qwen2"),
        ("deepseek-r1", "deepseek_v3"),
        ("llama-3.", "llama"),
    ):
        if base.startswith(prefix):
            return kind
    return ""


@dataclass(frozen=True)
class FamilyFlag:
    flag: str
    value: str | None
    reason: str
    cause: str


def family_flags(
    model: ModelFacts, caps: VllmCapabilities, reasoning: str | None, tools: str | None
) -> tuple[list[FamilyFlag], list[str]]:
    """The parser flags (configured, or the family's own where the release has them) and warnings."""
    family = family_of(model)
    flags: list[FamilyFlag] = []
    warnings: list[str] = []
    if reasoning is not None and reasoning != OFF:
        flags.append(
            FamilyFlag("--reasoning-parser", reasoning, "set in config (reasoning_parser)", "reasoning_parser")
        )
    elif reasoning is None and family is not None and family.reasoning is not None:
        if caps.has("--reasoning-parser"):
            flags.append(
                FamilyFlag(
                    "--reasoning-parser",
                    family.reasoning,
                    f"{family.label} thinks before it answers: the reply's reasoning goes to reasoning_content "
                    f'(reasoning_parser = "off" turns it off)',
                    "reasoning_parser",
                )
            )
        else:
            warnings.append(
                f"vLLM {caps.version} has no --reasoning-parser: {family.label}'s thinking stays in the text"
            )
    if tools is not None and tools != OFF:
        flags += _tool_flags(tools, "set in config (tool_call_parser)")
    elif tools is None and family is not None and family.tools is not None:
        if caps.has("--tool-call-parser") and caps.has("--enable-auto-tool-choice"):
            flags += _tool_flags(
                family.tools,
                f"{family.label}'s tool-call format: the OpenAI API's tools work "
                '(tool_call_parser = "off" turns it off)',
            )
        else:
            warnings.append(f"vLLM {caps.version} has no --tool-call-parser: tool calls are not parsed")
    return flags, warnings


def _tool_flags(parser: str, reason: str) -> list[FamilyFlag]:
    return [
        FamilyFlag("--enable-auto-tool-choice", None, "lets the model decide when to call a tool", "tool_call_parser"),
        FamilyFlag("--tool-call-parser", parser, reason, "tool_call_parser"),
    ]
