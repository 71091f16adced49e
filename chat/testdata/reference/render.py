"""Reference renderer for chat's differential test.

Reads JSON lines on stdin, one case each:

    {"id": "...", "template": "...", "bos_token": "...", "eos_token": "...",
     "now": "2024-07-26T10:00:00", "request": {<chat-completions body>}}

(or, with "vars": {...} in place of "request", the template rendered with
those variables alone)
and writes one JSON line per case to stdout:

    {"id": "...", "text": "<rendered prompt>"}   or   {"id": "...", "error": "..."}

It renders the way a vLLM server does for /v1/chat/completions: the
request's messages are normalized as vLLM's chat_utils does (content
parts joined with "\n" for templates that print content as a string,
kept as a list of {"type": ...} parts for templates that loop over it;
tool-call arguments decoded from their JSON string; tools dumped as
vLLM's request model dumps them), the chat_template_kwargs are merged
and filtered as vLLM's renderer does, and the template is rendered in a
Jinja2 environment configured as Hugging Face transformers configures
it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
loopcontrols extension, a {% generation %} tag, and transformers'
tojson, raise_exception and strftime_now). continue_final_message cuts
the rendering after the final message as transformers does.

Everything here is written from reading those projects; it imports only
jinja2 so that it runs on a machine with Debian's python3-jinja2 alone.
The one liberty: strftime_now reads the case's fixed "now" so that both
sides of the test agree on the date.
"""

import json
import sys
from collections import deque
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: a block that
    renders its body unchanged when no assistant mask is asked for."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_render_body"), [], [], body
        ).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# --- vLLM's content-format detection: a template that loops over a
# message's content gets content as a list of parts ("openai"); any other
# gets it as one string ("string").


def reads_var(node, name, key=None):
    """node reads name (or name.key / name['key']), possibly through a
    filter, a test or a slice."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and reads_var(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return reads_var(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(
        node.arg, jinja2.nodes.Slice
    ):
        return reads_var(node.node, name, key)
    if key is None:
        return (
            isinstance(node, jinja2.nodes.Name)
            and node.ctx == "load"
            and node.name == name
        )
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            reads_var(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return reads_var(node.node, name) and node.attr == key
    return False


def aliases_of(root, name):
    names = [name]
    queue = deque([name])
    while queue:
        current = queue.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if reads_var(assign.node, current) and isinstance(
                assign.target, jinja2.nodes.Name
            ):
                names.append(assign.target.name)
                if assign.target.name != current:
                    queue.append(assign.target.name)
    return names


def content_format(env, source):
    try:
        root = env.parse(source)
    except Exception:
        return "string"
    message_lists = aliases_of(root, "messages")
    message_vars = []
    for loop in root.find_all(jinja2.nodes.For):
        if any(reads_var(loop.iter, n) for n in message_lists):
            if isinstance(loop.target, jinja2.nodes.Name):
                message_vars.append(loop.target.name)
    for loop in root.find_all(jinja2.nodes.For):
        if any(reads_var(loop.iter, n, "content") for n in message_vars):
            return "openai"
    return "string"


# --- vLLM's message normalization.

TEXT_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
MEDIA = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
}


class Unsupported(Exception):
    pass


def parse_parts(parts, wrap):
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append({"type": "text", "text": part} if wrap else part)
            continue
        if not isinstance(part, dict):
            raise ValueError("content part is not an object")
        kind = part.get("type")
        if kind in TEXT_KEYS:
            text = part.get(TEXT_KEYS[kind])
            if text is None and kind in ("text", "refusal"):
                continue
            if not isinstance(text, str):
                raise ValueError("text part without a string")
            out.append({"type": "text", "text": text} if wrap else text)
        elif kind in MEDIA:
            if not wrap:
                raise Unsupported("media in a string-content template")
            out.append({"type": MEDIA[kind]})
        else:
            raise ValueError("unsupported content part %r" % (kind,))
    return out if wrap else "\n".join(out)


def normalize_messages(messages, wrap):
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty array")
    conversation = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError("a message needs a string role")
        role = msg["role"]
        content = msg.get("content")
        reasoning = msg.get("reasoning")
        if reasoning is None:
            reasoning = msg.get("reasoning_content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            raise ValueError("content must be a string, an array or null")
        out = {"role": role, "content": parse_parts(content, wrap)}
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise ValueError("tool_calls must be an array")
                out["tool_calls"] = [normalize_call(c) for c in calls]
            if reasoning is not None:
                out["reasoning"] = reasoning
                out["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in msg:
                out["tool_call_id"] = msg["tool_call_id"]
            c = out["content"]
            if isinstance(c, list):
                if not any(isinstance(p, dict) and p.get("type") != "text" for p in c):
                    texts = [p.get("text", "") for p in c if isinstance(p, dict)]
                    out["content"] = "\n".join(texts) if texts else ""
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            out["task"] = msg["task"]
        if role == "developer":
            out["tools"] = msg.get("tools")
        conversation.append(out)
    for out in conversation:
        calls = out.get("tool_calls")
        if out["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del out["tool_calls"]
            continue
        for call in calls:
            fn = call["function"]
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args)
                except ValueError:
                    fn["arguments"] = {}
            elif not isinstance(args, (dict, list)):
                fn["arguments"] = {}
    return conversation


def normalize_call(call):
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ValueError("a tool call needs a function object")
    out = {}
    if "id" in call:
        out["id"] = call["id"]
    fn = call["function"]
    out["function"] = {}
    if "arguments" in fn:
        out["function"]["arguments"] = fn["arguments"]
    if "name" in fn:
        out["function"]["name"] = fn["name"]
    if "type" in call:
        out["type"] = call["type"]
    return out


def normalize_tools(tools):
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be an array")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError("a tool must be an object")
        if tool.get("type", "function") != "function":
            raise ValueError("tool type must be function")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError("a tool needs a function with a name")
        desc = fn.get("description")
        params = fn.get("parameters")
        if desc is not None and not isinstance(desc, str):
            raise ValueError("description must be a string")
        if params is not None and not isinstance(params, dict):
            raise ValueError("parameters must be an object")
        defer = fn.get("defer_loading")
        if defer is None:
            defer = tool.get("defer_loading")
        dumped_fn = {"name": fn["name"], "description": desc, "parameters": params}
        if defer is not None:
            dumped_fn["defer_loading"] = defer
        for k, v in fn.items():
            if k not in ("name", "description", "parameters", "defer_loading"):
                dumped_fn[k] = v
        dumped = {"type": "function", "function": dumped_fn}
        if tool.get("defer_loading") is not None:
            dumped["defer_loading"] = tool["defer_loading"]
        out.append(dumped)
    return out


# apply_chat_template's own parameters: vLLM lets them through whether or
# not the template reads them. Of those, the ones that are not template
# variables are consumed by apply_chat_template and never reach the
# template.
HF_PARAMS = {
    "conversation",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}
CONSUMED = HF_PARAMS - {"documents", "add_generation_prompt", "continue_final_message"}

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def lax_bool(v):
    """A bool as pydantic's lax mode reads one."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return v == 1
    if isinstance(v, str):
        if v.lower() in ("1", "on", "t", "true", "y", "yes"):
            return True
        if v.lower() in ("0", "off", "f", "false", "n", "no"):
            return False
    raise ValueError("not a boolean: %r" % (v,))


def render(case):
    env = make_env(datetime.fromisoformat(case["now"]))
    source = case["template"]
    if "vars" in case:
        # The template alone, with the given variables: for comparing the
        # Jinja2 semantics themselves.
        return env.from_string(source).render(**case["vars"])
    req = case["request"]
    if not isinstance(req, dict):
        raise ValueError("body is not an object")
    template = env.from_string(source)
    wrap = content_format(env, source) == "openai"
    conversation = normalize_messages(req.get("messages"), wrap)
    tools = normalize_tools(req.get("tools"))

    agp = lax_bool(req.get("add_generation_prompt", True))
    cfm = lax_bool(req.get("continue_final_message", False))
    if agp and cfm:
        raise ValueError("continue_final_message and add_generation_prompt")
    user = req.get("chat_template_kwargs") or {}
    if not isinstance(user, dict):
        raise ValueError("chat_template_kwargs must be an object")
    if {"chat_template", "tokenize"} & user.keys():
        raise ValueError("chat_template_kwargs may not set chat_template or tokenize")
    kwargs = dict(user)
    kwargs["add_generation_prompt"] = agp
    kwargs["continue_final_message"] = cfm
    declared = jinja2.meta.find_undeclared_variables(env.parse(source))
    kwargs = {k: v for k, v in kwargs.items() if k in declared or k in HF_PARAMS}
    if "conversation" in kwargs or "tools" in kwargs or "messages" in kwargs:
        raise ValueError("chat_template_kwargs repeats an argument")
    documents = kwargs.pop("documents", None)
    if documents is not None and (
        not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents)
    ):
        raise ValueError("documents must be a list of objects")
    kwargs.pop("add_generation_prompt")
    kwargs.pop("continue_final_message")
    for k in CONSUMED:
        kwargs.pop(k, None)

    variables = {}
    if case.get("bos_token"):
        variables["bos_token"] = case["bos_token"]
    if case.get("eos_token"):
        variables["eos_token"] = case["eos_token"]
    variables.update(kwargs)

    final = None
    if cfm:
        last = conversation[-1]
        final = last.get("content")
        if final is None:
            raise ValueError("the final message has no content to continue")
        if "content" not in source:
            raise ValueError("the template does not read content")
        if isinstance(final, list):
            for part in reversed(final):
                if "text" in part:
                    final = part["text"]
                    part["text"] = part["text"] + CONTINUE_TAG
                    break
            else:
                raise ValueError("no text to continue in the final message")
        else:
            last["content"] = final + CONTINUE_TAG

    text = template.render(
        messages=conversation,
        tools=tools,
        documents=documents,
        add_generation_prompt=agp,
        **variables,
    )
    if cfm:
        if final.strip() not in text or CONTINUE_TAG.strip() not in text:
            raise ValueError("the final message does not appear in the rendering")
        at = text.rindex(CONTINUE_TAG.strip())
        if text[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
            text = text[:at]
        else:
            text = text[:at].rstrip()
    return text


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        try:
            out = {"id": case["id"], "text": render(case)}
        except Unsupported as e:
            out = {"id": case["id"], "unsupported": str(e)}
        except Exception as e:  # every failure is an answer, not a crash
            out = {"id": case["id"], "error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
