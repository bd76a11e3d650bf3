"""Chat sets and chat tokenizers the tests and the benchmark make from files that ship with
Python (nothing downloaded): a BPE tokenizer trained on stdlib text with chat special tokens,
three chat template styles, and conversations with a skewed length distribution (many short
answers, a long tail) in each input format.

Each template's answer text, as it writes it (ANSWER_TEXT), is what an independent count of
assistant tokens encodes with the plain `tokenizers` tokenizer (no template, no mask code)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.support.data_fixtures import EOS, stdlib_corpus

SPECIALS = ["<unk>", EOS, "<|im_start|>", "<|im_end|>", "<|user|>", "<|assistant|>", "<|system|>"]

# {% generation %} markers around each answer and its EOS (transformers' assistant mask)
GENERATION = (
    "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# ChatML, no markers: the mask comes from rendering prefix by prefix
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama-2 style: a system prompt (a default one when the conversation has none) inside the
# first user turn, no generation prompt, answers end with EOS
SYSTEM = (
    "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = 'You are a careful assistant.' %}{% set msgs = messages %}{% endif %}"
    "<s>[SYS]{{ sys }}[/SYS]{% for m in msgs %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"
)
# renders no assistant turn at all (bad input)
NO_ASSISTANT = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}\n{% endif %}{% endfor %}"

TEMPLATES = {"generation": GENERATION, "chatml": CHATML, "system": SYSTEM}
ANSWER_TEXT = {  # how each template writes an answer: the tokens an answer trains on
    "generation": lambda c: f"{c}</s>",
    "chatml": lambda c: f"{c}<|im_end|>\n",
    "system": lambda c: f" {c}</s>",
}


def chat_tokenizer(root: Path, template: str | None = "generation", vocab_size: int = 384) -> Path:
    """A BPE tokenizer trained on stdlib text with the chat special tokens, saved as
    save_pretrained would; `template` (a TEMPLATES name) as its chat_template.jinja, or none."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = stdlib_corpus(root / "corpus", max_files=6)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([json.loads(x)["text"] for x in corpus.read_text().splitlines()], trainer)
    folder = root / f"tok-{template}"
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "unk_token": "<unk>"}))
    if template:
        (folder / "chat_template.jinja").write_text(TEMPLATES[template])
    return folder


def _words() -> list[str]:
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # `this` prints the Zen on import
        import this

    return [w for w in codecs.decode(this.s, "rot13").split() if w.isalpha()]


def skewed_conversations(
    n: int, seed: int = 0, tail_words: int = 120, system_every: int = 0
) -> list[list[dict[str, str]]]:
    """`n` conversations: a short question, an answer of a few words for most, a long tail
    (one in ten up to `tail_words` words), every third of two turns; a system turn every
    `system_every`-th (0: none)."""
    rng = random.Random(seed)
    words = _words()

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(max(1, k))).capitalize()

    out = []
    for i in range(n):
        long = rng.random() < 0.1
        conv = []
        if system_every and i % system_every == 0:
            conv.append({"role": "system", "content": text(4)})
        for _ in range(2 if i % 3 == 0 else 1):
            conv.append({"role": "user", "content": text(rng.randint(2, 6)) + "?"})
            k = rng.randint(tail_words // 2, tail_words) if long else rng.randint(2, 8)
            conv.append({"role": "assistant", "content": text(k) + "."})
        out.append(conv)
    return out


def as_format(conv: list[dict[str, str]], fmt: str) -> dict[str, Any]:
    """One conversation as a record of `fmt` (alpaca and prompt_completion: the first exchange)."""
    if fmt == "messages":
        return {"messages": conv}
    if fmt == "sharegpt":
        names = {"system": "system", "user": "human", "assistant": "gpt"}
        return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conv]}
    user = next(m["content"] for m in conv if m["role"] == "user")
    answer = next(m["content"] for m in conv if m["role"] == "assistant")
    if fmt == "alpaca":
        return {"instruction": user, "input": "", "output": answer}
    return {"prompt": user, "completion": answer}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def assistant_tokens(
    tok_dir: Path, template: str, convs: list[list[dict[str, str]]], last: bool = False
) -> int:
    """The independent count: each answer as the template writes it, encoded by the plain
    tokenizer (no chat template, no masking code)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    total = 0
    for conv in convs:
        answers = [m["content"] for m in conv if m["role"] == "assistant"]
        for a in answers[-1:] if last else answers:
            total += len(tok.encode(ANSWER_TEXT[template](a), add_special_tokens=False).ids)
    return total
