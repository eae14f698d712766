"""Tool specs (OpenAI's `{"type": "function", "function": {name, description, parameters}}`) and tool calls: what a
record's tools must be, and the calls a model writes, read the way Qwen3's chat template writes them."""

import json
import re

from jsonschema import Draft202012Validator, SchemaError, validators

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def tool_spec_problems(tools) -> list[str]:
    """Everything wrong with a record's `tools`, in words; [] when each is a function with a name and its parameters
    a JSON schema of an object (or none)."""
    if tools is None:
        return []
    if not isinstance(tools, list) or not tools:
        return ["tools: a non-empty list of tool definitions"]
    problems, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            problems.append(f"{where}: {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
            continue
        if tool.get("type", "function") != "function":
            problems.append(f"{where}.type: 'function', got {str(tool.get('type'))[:40]!r}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            problems.append(f"{where}.function.name: 1-128 letters, digits, '_', '.', ':' or '-', got "
                            f"{str(name)[:40]!r}")
        elif name in names:
            problems.append(f"{where}.function.name: {name!r} is named twice")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            problems.append(f"{where}.function.description: a string")
        problems += [f"{where}.function.parameters: {p}" for p in _schema_problems(function.get("parameters"))]
    return problems


def _schema_problems(schema) -> list[str]:
    if schema is None:
        return []
    if not isinstance(schema, dict):
        return [f"a JSON schema object, got {type(schema).__name__}"]
    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return [f"not a valid JSON schema: {exc.message[:300]}"]
    if schema.get("type", "object") != "object":
        return [f"the arguments are an object: type 'object', got {str(schema.get('type'))[:40]!r}"]
    return []


def tools_by_name(tools) -> dict[str, dict]:
    """name -> the function part of each tool of a (checked) record."""
    return {tool["function"]["name"]: tool["function"] for tool in tools or []}


def call_problems(call, tools) -> list[str]:
    """What is wrong with an expected call `{"name", "arguments"}` of a record with these (checked) tools."""
    if not isinstance(call, dict) or set(call) - {"name", "arguments"} or not isinstance(call.get("name"), str):
        return ['expected: a tool call {"name": ..., "arguments": {...}}']
    known = tools_by_name(tools)
    if call["name"] not in known:
        return [f"expected: calls {call['name'][:60]!r}, which is not one of the record's tools "
                f"({', '.join(sorted(known)) or 'it has none'})"]
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return [f"expected.arguments: a JSON object, got {type(arguments).__name__}"]
    problem = argument_problem(known[call["name"]], arguments)
    return [f"expected.arguments: {problem}"] if problem else []


def argument_problem(function: dict, arguments: dict) -> str:
    """Why `arguments` do not fit the tool's parameters schema, or ""."""
    schema = function.get("parameters")
    if not schema:
        return ""
    error = next(iter(validators.validator_for(schema, default=Draft202012Validator)(schema).iter_errors(arguments)),
                 None)
    if error is None:
        return ""
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message[:300]}"


def parse_tool_call(text: str) -> dict | None:
    """The first tool call in a model's answer, as {"name", "arguments"}, or None: a `<tool_call>{json}</tool_call>`
    block (Qwen3's template; text around it allowed), else the first JSON object in the text that is a call (a bare
    `{"name", "arguments"}` or OpenAI's `{"type": "function", "function": {...}}`). Arguments given as a JSON string
    are read as the object they hold."""
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if blocks:
        return _as_call(_json_object(blocks[0]))
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        call = _as_call(value)
        if call is not None:
            return call
    return None


def _json_object(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _as_call(value) -> dict | None:
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json_object(arguments)
    return {"name": value["name"], "arguments": arguments}
