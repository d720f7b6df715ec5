"""Chat prompts: the GGUF's own Jinja template, or a stated fallback when it has none."""

from __future__ import annotations

from dataclasses import dataclass

# Turn formats for GGUFs without `tokenizer.chat_template`, picked by marker tokens in
# the vocabulary (a model trained on a format has its markers as single tokens).
_FALLBACKS = [
    ("Gemma turn format", "<start_of_turn>",
     "<start_of_turn>{role}\n{content}<end_of_turn>\n", "<start_of_turn>model\n", {"assistant": "model"}),
    ("ChatML", "<|im_start|>", "<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n", {}),
]
_PLAIN = ("plain 'User:/Assistant:' transcript", None, "{Role}: {content}\n", "Assistant:", {})


@dataclass
class ChatFormat:
    name: str  # "the GGUF's chat template" or the fallback's name
    is_fallback: bool
    template: str | None = None
    turn: str = ""
    generation_prompt: str = ""
    roles: dict | None = None
    bos_text: str = ""
    eos_text: str = ""
    stop: tuple = ()

    @classmethod
    def for_model(cls, model, template: str | None) -> "ChatFormat":
        bos = model.token_text(model.bos) if model.bos >= 0 else ""
        eos = model.token_text(model.eos) if model.eos >= 0 else ""
        if template:
            return cls("the GGUF's chat template", False, template, bos_text=bos, eos_text=eos)
        for name, marker, turn, gen, roles in _FALLBACKS:
            if len(model.tokenize(marker, add_special=False)) == 1:
                end_marker = turn.split("{content}")[1].strip()
                return cls(name, True, None, turn, gen, roles, bos, eos, stop=(end_marker,))
        name, _, turn, gen, roles = _PLAIN
        return cls(name, True, None, turn, gen, roles, bos, eos, stop=("\nUser:",))

    def render(self, messages: list[dict]) -> str:
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message needs a 'role' and a 'content'")
        if self.template is not None:
            return _render_jinja(self.template, messages, self.bos_text, self.eos_text)
        roles = self.roles or {}
        text = "".join(self.turn.format(role=roles.get(m["role"], m["role"]), Role=m["role"].capitalize(),
                                        content=m["content"]) for m in messages)
        return self.bos_text + text + self.generation_prompt


def _render_jinja(template: str, messages, bos: str, eos: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos, raise_exception=raise_exception)
