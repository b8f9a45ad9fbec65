"""Request bodies of the OpenAI-compatible API → checked records; each bad field → one OpenAI-style error.

The ranges are the project's (SamplingParams.validate, SpecConfig.validate, chat.MAX_MESSAGE_CHARS,
store.validation): a rule the chat window applies is applied here by the same code, with the field named.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional

from localspec.chat import MAX_MESSAGE_CHARS
from localspec.config import ConfigError, SamplingParams, SpecConfig, check_tree_nodes
from localspec.store.validation import ROLES, clean_text
from localspec.structured.grammar import Constraint, json_schema_constraint
from localspec.structured.stops import check_stops
from localspec.structured.tools import ToolSpec

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_MESSAGES = 512
MAX_TOOLS = 128  # OpenAI's limit
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
API_ROLES = (*ROLES, "tool")
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; 0 is greedy
DEFAULT_MAX_TOKENS = SamplingParams().max_new_tokens
Endpoint = Literal["chat", "completions"]
# accepted only with these values (what OpenAI's clients send by default); anything else is refused by name
NEUTRAL = {
    "logit_bias": (None, {}),
    "echo": (False, None),
    "best_of": (1, None),
}
# the penalties' request fields (null: neutral) and the words SamplingParams.validate names them with
PENALTIES = {
    "repetition_penalty": "repetition penalty",  # vLLM's: > 0, 1 off
    "frequency_penalty": "frequency penalty",  # OpenAI's: -2..2, 0 off
    "presence_penalty": "presence penalty",  # OpenAI's: -2..2, 0 off
}


class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Extension:
    """The `localspec` field: speculation settings (None = the entry's default) and the provenance opt-in."""

    proposer: str | None = None
    k: int | None = None
    adaptive: bool | None = None
    tree_nodes: int | None = None  # 0: chains of K; > 0: token trees of this many nodes where the proposer drafts them
    provenance: bool = False
    truncate: bool = False  # a chat that does not fit: leave out the oldest turns (chat.TRUNCATION_POLICY), not 400


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: Endpoint
    model: str
    sampling: SamplingParams
    messages: tuple = ()  # chat: ({'role', 'content'}, …)
    prompt: str = ""  # completions
    suffix: str = ""  # completions: the text after the gap to fill in (models/fim.py); "" continues the prompt
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    stop: tuple[str, ...] = ()
    extension: Extension = field(default_factory=Extension)
    tools: Optional[ToolSpec] = None  # chat: the functions offered (None: no tools, or tool_choice none)
    constraint: Optional[Constraint] = None  # a grammar the answer follows (response_format, tool_choice)

    def spec_for(self, session) -> SpecConfig:
        """The entry's defaults with the request's overrides, checked against the loaded pair."""
        ext = self.extension
        try:
            spec = session.default_spec(
                proposer=ext.proposer, k=ext.k, adaptive=ext.adaptive, tree_nodes=ext.tree_nodes
            )
            if spec.proposer not in session.proposers:
                raise APIError(
                    f"this model pair has no {spec.proposer!r} proposer; it has: {', '.join(session.proposers)}",
                    "localspec.proposer",
                )
            return spec.validate()
        except ConfigError as exc:
            message = str(exc)
            param = "localspec.tree_nodes" if "tree nodes" in message else "localspec.k" if "K" in message else None
            raise APIError(message, param or "localspec.proposer") from None


EXTENSION_FIELDS = ("proposer", "k", "adaptive", "tree_nodes", "provenance", "truncate")


def _bool(body: dict, name: str, default: bool = False, where: str = "") -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{where}{name} must be true or false (got {value!r})", where + name)
    return value


def _int(body: dict, name: str, where: str = "") -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise APIError(f"{where}{name} must be a whole number (got {value!r})", where + name)
    return value


def _content(value: Any, index: int) -> str:
    """A message's content: a string, or a list of {'type': 'text', 'text': …} parts (joined)."""
    param = f"messages[{index}].content"
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError("only text content parts are supported ({'type': 'text', 'text': ...})", param)
            texts.append(part["text"])
        value = "".join(texts)
    try:
        text = clean_text(value, param)
    except ConfigError as exc:
        raise APIError(str(exc), param) from None
    if len(text) > MAX_MESSAGE_CHARS:
        raise APIError(f"{param} has {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}", param)
    return text


def _messages(value: Any) -> tuple:
    if not isinstance(value, list) or not value:
        raise APIError("messages must be a non-empty list of {'role', 'content'} objects", "messages")
    if len(value) > MAX_MESSAGES:
        raise APIError(f"messages has {len(value)} entries; the limit is {MAX_MESSAGES}", "messages")
    out = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise APIError(f"messages[{index}] must be an object with 'role' and 'content'", f"messages[{index}]")
        role = "system" if message.get("role") == "developer" else message.get("role")
        if role not in API_ROLES:
            raise APIError(
                f"messages[{index}].role is {message.get('role')!r}; choose one of {', '.join(API_ROLES)}",
                f"messages[{index}].role",
            )
        # a message's `name` (a participant's name) is ignored: the chat templates have no place for it
        entry = {"role": role, "content": _content(message.get("content"), index)}
        if message.get("tool_calls"):
            if role != "assistant":
                raise APIError("only an assistant message has tool_calls", f"messages[{index}].tool_calls")
            entry["tool_calls"] = _tool_calls(message["tool_calls"], index)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise APIError("tool_call_id must be a string", f"messages[{index}].tool_call_id")
            entry["tool_call_id"] = call_id
        out.append(entry)
    if not out[-1]["content"].strip() and not out[-1].get("tool_calls"):
        raise APIError("the last message is empty", f"messages[{len(out) - 1}].content")
    return tuple(out)


def _tool_calls(value: Any, index: int) -> list[dict]:
    """An assistant message's tool_calls → [{'id', 'name', 'arguments'}]."""
    param = f"messages[{index}].tool_calls"
    if not isinstance(value, list):
        raise APIError("tool_calls must be a list of {'id', 'type': 'function', 'function'} objects", param)
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError("each tool call needs function: {'name', 'arguments'}", f"{param}[{i}].function")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise APIError("function.arguments must be a JSON string", f"{param}[{i}].function.arguments")
        call_id = call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{index}_{i}",
                "name": function["name"],
                "arguments": arguments,
            }
        )
    return calls


def _tools(body: dict) -> Optional[ToolSpec]:
    """tools, tool_choice and parallel_tool_calls → a ToolSpec; None when no function may be called."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = _bool(body, "parallel_tool_calls", default=True)
    if tools is None:
        tools = []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise APIError(f"tools must be a list of at most {MAX_TOOLS} {{'type': 'function', 'function'}}", "tools")
    functions = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict):
            raise APIError("each tool must be {'type': 'function', 'function': {'name', ...}}", f"tools[{i}]")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise APIError("a function's name is 1 to 64 letters, digits, '_' or '-'", f"tools[{i}].function.name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise APIError("parameters must be a JSON Schema object", f"tools[{i}].function.parameters")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise APIError("description must be a string", f"tools[{i}].function.description")
        kept = {"name": name}
        kept.update({k: v for k, v in (("description", description), ("parameters", parameters)) if v is not None})
        functions.append(kept)
    if choice is None:
        choice = "auto" if functions else "none"
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise APIError("tool_choice names a function as {'type': 'function', 'function': {'name'}}", "tool_choice")
        if name not in [f["name"] for f in functions]:
            raise APIError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise APIError(
            "tool_choice is none, auto, required or {'type': 'function', 'function': {'name'}}", "tool_choice"
        )
    elif choice == "required" and not functions:
        raise APIError("tool_choice required needs tools", "tool_choice")
    if not functions or choice == "none":
        return None
    return ToolSpec(tuple(functions), choice, parallel)


def _response_format(value: Any) -> Optional[Constraint]:
    """response_format → a grammar: text (none), json_object (any JSON object) or json_schema (its schema)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    try:
        if kind == "json_object":
            return json_schema_constraint({"type": "object"}, "response_format")
        if kind == "json_schema":
            spec = value.get("json_schema")
            schema = spec.get("schema", {}) if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError(
                    "json_schema must be {'name', 'schema': {...}} with the schema as an object",
                    "response_format.json_schema",
                )
            return json_schema_constraint(schema, "response_format.json_schema.schema")
    except ConfigError as exc:
        raise APIError(
            str(exc), "response_format.json_schema.schema" if kind == "json_schema" else "response_format"
        ) from None
    raise APIError("response_format.type is text, json_object or json_schema", "response_format.type")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError("stop must be a non-empty string or a list of them", "stop")
    try:
        return check_stops(stops)
    except ConfigError as exc:
        raise APIError(str(exc), "stop") from None


def _extension(value: Any) -> Extension:
    if value is None:
        return Extension()
    if not isinstance(value, dict):
        raise APIError(f"localspec must be an object: {{{', '.join(EXTENSION_FIELDS)}}}", "localspec")
    unknown = set(value) - set(EXTENSION_FIELDS)
    if unknown:
        raise APIError(
            f"localspec has unknown field {sorted(unknown)[0]!r}; it takes {', '.join(EXTENSION_FIELDS)}",
            f"localspec.{sorted(unknown)[0]}",
        )
    proposer = value.get("proposer")
    if proposer is not None and not isinstance(proposer, str):
        raise APIError(f"localspec.proposer must be a name (got {proposer!r})", "localspec.proposer")
    k = _int(value, "k", "localspec.")
    if k is not None:
        try:
            SpecConfig(k=k).validate()
        except ConfigError as exc:
            raise APIError(str(exc), "localspec.k") from None
    adaptive = value.get("adaptive")
    if adaptive is not None and not isinstance(adaptive, bool):
        raise APIError(f"localspec.adaptive must be true or false (got {adaptive!r})", "localspec.adaptive")
    tree_nodes = value.get("tree_nodes")
    if tree_nodes is not None:
        try:
            check_tree_nodes(tree_nodes, "localspec.tree_nodes")
        except ConfigError as exc:
            raise APIError(str(exc), "localspec.tree_nodes") from None
    return Extension(
        proposer,
        k,
        adaptive,
        tree_nodes,
        _bool(value, "provenance", where="localspec."),
        _bool(value, "truncate", where="localspec."),
    )


def _sampling(body: dict, top_logprobs: int, top_param: str) -> SamplingParams:
    max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
    seed = _int(body, "seed")
    top_k = _int(body, "top_k")
    if top_k == -1:  # vLLM's "off"
        top_k = 0
    values = {
        "temperature": body.get("temperature", DEFAULT_TEMPERATURE),
        "top_p": body.get("top_p", 1.0),
        "top_k": top_k,
        "max_new_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "seed": secrets.randbelow(2**63) if seed is None else seed,
        "seeded": seed is not None,
        "top_logprobs": top_logprobs,
        **{name: body.get(name) for name in PENALTIES},
    }
    values = {k: (SamplingParams.__dataclass_fields__[k].default if v is None else v) for k, v in values.items()}
    params = SamplingParams(**values)
    try:
        return params.validate()
    except ConfigError as exc:
        message = str(exc)
        param = next(
            (
                p
                for p, words in (
                    ("temperature", "temperature"),
                    ("top_p", "top-p"),
                    ("top_k", "top-k"),
                    ("seed", "seed"),
                    (top_param, "top logprobs"),
                    *PENALTIES.items(),
                )
                if message.startswith(words)
            ),
            "max_tokens",
        )
        if param == top_param:
            message = message.replace("top logprobs", top_param, 1)  # the field's name in the request
        elif param in PENALTIES:
            message = message.replace(PENALTIES[param], param, 1)
        raise APIError(message, param) from None


def parse_request(body: Any, endpoint: Endpoint) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError("model is required: one of the names GET /v1/models lists", "model")
    n = body.get("n", 1)
    if n not in (1, None) or isinstance(n, bool):
        raise APIError(f"n must be 1: localspec returns one choice per request (got {n!r})", "n")
    for name, allowed in NEUTRAL.items():
        if name in body and not any(body[name] == a and type(body[name]) is type(a) for a in allowed):
            raise APIError(f"{name} is not supported by localspec (leave it out)", name)
    min_p = body.get("min_p")
    if min_p not in (None, 0, 0.0) or isinstance(min_p, bool):
        raise APIError("min_p is not supported by localspec (leave it out or send 0); top_k and top_p are", "min_p")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise APIError("stream_options is an object, allowed only with stream: true", "stream_options")
    include_usage = _bool(options or {}, "include_usage", where="stream_options.")
    if endpoint == "chat":
        logprobs = _bool(body, "logprobs")
        top = _int(body, "top_logprobs")
    else:
        top = _int(body, "logprobs")
        logprobs = top is not None
    top_param = "top_logprobs" if endpoint == "chat" else "logprobs"
    if top and not logprobs:
        raise APIError("top_logprobs needs logprobs: true", top_param)
    request = GenerationRequest(
        endpoint=endpoint,
        model=model,
        sampling=_sampling(body, top or 0, top_param),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        stop=_stop(body.get("stop")),
        extension=_extension(body.get("localspec")),
    )
    constraint = _response_format(body.get("response_format"))
    if endpoint == "chat":
        tools = _tools(body)
        try:
            forced = tools.constraint() if tools is not None else None
        except ConfigError as exc:  # a function's parameters schema llguidance cannot compile
            raise APIError(str(exc), "tools") from None
        if forced is not None and constraint is not None:
            raise APIError(
                "tool_choice required (or a named function) and response_format cannot be combined", "response_format"
            )
        if body.get("suffix") not in (None, ""):
            raise APIError("suffix (fill in the middle) is for /v1/completions", "suffix")
        return replace(request, messages=_messages(body.get("messages")), tools=tools, constraint=constraint or forced)
    for name, neutral in (("tools", (None, [])), ("tool_choice", (None, "none", "auto"))):
        if body.get(name) not in neutral:
            raise APIError(f"{name} is for /v1/chat/completions", name)
    request = replace(request, constraint=constraint)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise APIError("prompt must be a non-empty string (one prompt per request)", "prompt")
    if len(prompt) > MAX_MESSAGE_CHARS:
        raise APIError(f"prompt has {len(prompt)} characters; the limit is {MAX_MESSAGE_CHARS}", "prompt")
    try:
        prompt = clean_text(prompt, "prompt")
    except ConfigError as exc:
        raise APIError(str(exc), "prompt") from None
    return replace(request, prompt=prompt, suffix=_suffix(body.get("suffix")))


def _suffix(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise APIError("suffix must be a string (the text after the gap to fill in)", "suffix")
    if len(value) > MAX_MESSAGE_CHARS:
        raise APIError(f"suffix has {len(value)} characters; the limit is {MAX_MESSAGE_CHARS}", "suffix")
    try:
        return clean_text(value, "suffix")
    except ConfigError as exc:
        raise APIError(str(exc), "suffix") from None
