"""Tool calls: the functions a request offers, put into the prompt; the calls the model writes, read back.

The prompt: a chat template that uses a `tools` variable gets the tools and the conversation's tool calls and
results in the Hugging Face form (assistant `tool_calls` with `arguments` as an object, `role: "tool"` messages).
Any other template gets the generic format: a system-prompt section listing the functions as JSON and asking for
each call as `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; earlier calls are written that way in the
assistant's turn, and tool results are user turns inside `<tool_response>…</tool_response>`.

The output: every `<tool_call>…</tool_call>` block holding a JSON object with a known function's name and its
arguments becomes one OpenAI tool call (the format of the generic section, and of Qwen2.5's and Hermes' templates);
the text around them stays the content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from .grammar import Constraint, compact, lark_constraint

OPEN, CLOSE = "<tool_call>", "</tool_call>"
BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
GENERIC_SECTION = (
    "You can call these functions:\n{functions}\n\n"
    "To call a function, answer with one line per call, exactly in this form:\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<the arguments as JSON>}}}}</tool_call>\n'
    "Call a function only when it helps to answer; otherwise answer in words."
)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's form)

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolSpec:
    """The request's functions (OpenAI's `tools`, checked) and how to use them."""

    functions: tuple[dict, ...]  # ({"name", "description"?, "parameters"?}, …)
    choice: str = "auto"  # auto | required | none | a function's name (named)
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    @property
    def offered(self) -> tuple[dict, ...]:
        """The functions the model may call (a named choice: that one only; none: no function)."""
        if self.choice == "none":
            return ()
        if self.choice in ("auto", "required"):
            return self.functions
        return tuple(f for f in self.functions if f["name"] == self.choice)

    def constraint(self) -> Optional[Constraint]:
        """required / named: the answer is tool calls only, in the generic format (a grammar); else None."""
        if self.choice in ("auto", "none"):
            return None
        return tool_call_constraint(self.offered, self.parallel)

    def openai_tools(self) -> list[dict]:
        return [{"type": "function", "function": f} for f in self.offered]


def tool_call_constraint(functions: tuple[dict, ...], parallel: bool) -> Constraint:
    """One `<tool_call>{"name": …, "arguments": …}</tool_call>` (several, one per line, when parallel) whose name is
    one of the functions and whose arguments follow that function's parameters schema."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = json.dumps(compact({"anyOf": variants} if len(variants) > 1 else variants[0]))
    repeat = ' ("\\n" call)*' if parallel else ""
    lark = f'start: call{repeat}\ncall: "{OPEN}" body "{CLOSE}"\nbody: %json {schema}\n'
    return lark_constraint(lark, "tool_choice")


def template_uses_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads a `tools` variable (parsed, not run)."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or "tools" not in source:
        return False
    from jinja2 import meta
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return "tools" in meta.find_undeclared_variables(ImmutableSandboxedEnvironment().parse(source))
    except TemplateSyntaxError:
        return False


def call_text(name: str, arguments: str) -> str:
    """One call in the generic format (arguments: the JSON text a client sent back)."""
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    return OPEN + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + CLOSE


def generic_messages(messages: list[dict], spec: Optional[ToolSpec]) -> list[dict]:
    """The conversation in the generic format: plain {role, content} messages any template takes."""
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "\n".join(call_text(c["name"], c["arguments"]) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": "\n".join(p for p in (m["content"], calls) if p)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    functions = spec.offered if spec is not None else ()
    if functions:
        listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
        section = GENERIC_SECTION.format(functions=listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def native_messages(messages: list[dict]) -> list[dict]:
    """The conversation in the Hugging Face form a template with a `tools` section reads."""
    out = []
    for m in messages:
        message = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _object(c)}}
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool" and m.get("tool_call_id"):
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
    return out


def _object(call: dict) -> Any:
    try:
        return json.loads(call["arguments"])
    except ValueError:
        return call["arguments"]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def read_call(body: str, names: tuple[str, ...]) -> Optional[ToolCall]:
    """A block's JSON → a ToolCall, or None when it is not a call of a known function."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), data["name"], json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str, spec: ToolSpec) -> tuple[str, list[ToolCall]]:
    """(the content left, the calls) of a whole answer; a block that is not a valid call stays in the content. Not
    parallel: the first call only."""
    calls, content, at = [], [], 0
    for match in BLOCK.finditer(text):
        call = read_call(match.group(1).strip(), tuple(f["name"] for f in spec.offered))
        if call is None or (calls and not spec.parallel):
            continue
        content.append(text[at : match.start()])
        at = match.end()
        calls.append(call)
    content.append(text[at:])
    left = "".join(content)
    return (left.strip() if calls else left), calls


class ToolStream:
    """A streamed answer's text → content pieces and tool calls as they complete. Text that may be the start of
    `<tool_call>` is held back until it is known; a call's block is held until it closes."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.buffer = ""
        self.calls: list[ToolCall] = []

    def push(self, piece: str, done: bool = False) -> tuple[str, list[ToolCall]]:
        self.buffer += piece
        content, calls = "", []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = 0 if done else _partial_suffix(self.buffer, OPEN)
                content += self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep :]
                break
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                content += self.buffer[:start]
                self.buffer = self.buffer[start:]
                if done:  # an unclosed block stays text
                    content += self.buffer
                    self.buffer = ""
                break
            block = self.buffer[start : end + len(CLOSE)]
            one_more = self.spec.parallel or not (self.calls or calls)
            parsed = parse_tool_calls(block, self.spec)[1] if one_more else []
            if parsed:
                calls += parsed
                content += self.buffer[:start]
            else:
                content += self.buffer[: end + len(CLOSE)]
            self.buffer = self.buffer[end + len(CLOSE) :]
        if (self.calls or calls) and not content.strip():  # between and around calls, whitespace is layout
            content = ""
        self.calls += calls
        return content, calls


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that is a start of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
