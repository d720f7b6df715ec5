"""Chat prompts: the GGUF's own Jinja template, or a stated fallback when it has none."""

from __future__ import annotations

from dataclasses import dataclass

# A GGUF without `tokenizer.chat_template` is almost always a base (pretrained) model, like
# the embedded Gemma 3 270M: it was never trained on turn markers, but it continues a plain
# transcript well. So that is the fallback, and `chat` says so.
_TRANSCRIPT = ("plain 'User:/Assistant:' transcript", "{Role}: {content}\n", "Assistant:", "\nUser:")


# The variable Qwen3-style templates read to think or not: Anthropic's `thinking`, the Responses
# API's `reasoning.effort` and Chat Completions' `reasoning_effort` turn it (docs/server.md).
THINKING_SWITCH = "enable_thinking"
# efforts that ask for no reasoning; any other effort asks for it
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning efforts
NO_EFFORT = ("none", "minimal")


def effort_thinks(effort: str | None) -> bool | None:
    """An OpenAI reasoning effort as the thinking switch: None leaves the template's default."""
    return None if effort is None else effort not in NO_EFFORT


def thinking_effort(thinking: bool | None) -> str | None:
    """A thinking switch (Anthropic's `thinking`) as the chat body's `reasoning_effort`, the one
    field the chat request reads it from."""
    return None if thinking is None else "medium" if thinking else "none"


@dataclass
class ChatFormat:
    name: str  # "the GGUF's chat template" or the fallback's name
    is_fallback: bool
    template: str | None = None
    turn: str = ""
    generation_prompt: str = ""
    bos_text: str = ""
    eos_text: str = ""
    stop: tuple = ()

    @classmethod
    def for_model(cls, model, template: str | None) -> "ChatFormat":
        bos = model.token_text(model.bos) if model.bos >= 0 else ""
        eos = model.token_text(model.eos) if model.eos >= 0 else ""
        if template:
            return cls("the GGUF's chat template", False, template, bos_text=bos, eos_text=eos)
        name, turn, gen, stop = _TRANSCRIPT
        return cls(name, True, None, turn, gen, bos, eos, stop=(stop,))

    @property
    def thinks_on_request(self) -> bool:
        """The template has a thinking switch (THINKING_SWITCH) a request can turn."""
        return bool(self.template) and THINKING_SWITCH in self.template

    def thinking_vars(self, thinking: bool | None) -> dict | None:
        """The template variables that ask for thinking (True), none (False) or the template's
        default (None); None when the template has no switch: nothing can ask it to think."""
        if thinking is None or not self.thinks_on_request:
            return None
        return {THINKING_SWITCH: thinking}

    def render(self, messages: list[dict], tools: list[dict] | None = None, variables: dict | None = None) -> str:
        """The prompt text; `tools` (OpenAI's list) reach a template that renders them (tools.py
        rewrites the messages for one that does not); `variables`: more the template may read
        (`enable_thinking`); the fallback transcript reads none."""
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message needs a 'role' and a 'content'")
        if self.template is not None:
            return _render_jinja(self.template, messages, self.bos_text, self.eos_text, tools, variables)
        text = "".join(self.turn.format(Role=m["role"].capitalize(), content=m["content"]) for m in messages)
        return self.bos_text + text + self.generation_prompt


def _render_jinja(template: str, messages, bos: str, eos: str, tools=None, variables=None) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos, raise_exception=raise_exception,
                                            **({"tools": tools} if tools else {}), **(variables or {}))
