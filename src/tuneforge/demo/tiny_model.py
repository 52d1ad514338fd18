"""A tiny random-weight Llama model with a real trained tokenizer.

It lets the whole platform run end to end on a CPU without any download: the
tokenizer is a byte-level BPE trained here on a built-in corpus, the model is a
`LlamaForCausalLM` with a few hundred thousand random parameters, and both are
written with `save_pretrained`, so `AutoModelForCausalLM.from_pretrained(dir)`
and `AutoTokenizer.from_pretrained(dir)` load them like any hub model.

The weights are random, so the base model knows nothing; a LoRA adapter
trained on the demo dataset (`tuneforge.demo.dataset`) is what teaches it.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|im_end|>"  # ends every chat turn, so generation stops after an answer
PAD_TOKEN = "<|pad|>"
TURN_START_TOKEN = "<|im_start|>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, TURN_START_TOKEN]

# ChatML turns behind a BOS. The role check makes a malformed conversation fail
# loudly when the template is rendered instead of producing a silent mess.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SUBJECTS = [
    "the model", "a function", "the server", "my team", "the user", "this test",
    "the compiler", "our script", "the parser", "a worker", "the database", "the cache",
]
_VERBS = [
    "reads", "writes", "returns", "checks", "stores", "sends", "loads", "builds",
    "updates", "prints", "parses", "trains", "finds", "keeps", "moves", "opens",
]
_OBJECTS = [
    "the file", "a list of numbers", "the answer", "every line", "the config",
    "a new record", "the result", "two strings", "the code", "a small table",
    "the key", "each value", "the report", "an error message", "the data",
]
_ENDINGS = [
    "before it starts.", "after each step.", "when the job ends.", "in order.",
    "for every request.", "on the first try.", "without any change.", "again.",
    "at the end of the day.", "as fast as it can.", "once per hour.", "by itself.",
]
_QUESTIONS = [
    "What is the code for {name}?", "Where is the file for {name}?",
    "How do I run {name}?", "Can you explain {name}?", "Which value does {name} return?",
    "Tell me about {name}.", "Why does {name} fail?", "When should I call {name}?",
]
_NAMES = [
    "load_data", "parse_line", "train_step", "save_model", "read_config", "send_report",
    "count_words", "merge_files", "check_token", "build_index", "sort_items", "split_text",
]
_ARGS = ["x", "y", "items", "path", "text", "values", "count", "key", "row", "data"]
_OPERATORS = ["+", "-", "*", "//", "%", "==", "<", ">"]
_SYLLABLES = [
    "ka", "zo", "ri", "vel", "mor", "tan", "qu", "ix", "bel", "dra", "no", "sy", "pex",
    "lu", "gor", "fen", "tri", "ob", "ula", "wex", "ca", "dim", "el", "har",
]


def _english_lines(rng: random.Random, count: int) -> list[str]:
    lines = []
    for _ in range(count):
        sentence = " ".join(
            [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_ENDINGS)]
        )
        lines.append(sentence[0].upper() + sentence[1:])
    return lines


def _code_lines(rng: random.Random, count: int) -> list[str]:
    lines = []
    for _ in range(count):
        name, arg = rng.choice(_NAMES), rng.choice(_ARGS)
        op, number = rng.choice(_OPERATORS), rng.randint(0, 999)
        lines.append(
            f"def {name}({arg}):\n    # {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}\n"
            f"    return {arg} {op} {number}\n"
        )
        lines.append(f"for {arg} in range({number}):\n    print({name}({arg}))\n")
        lines.append(f'{{"{arg}": {number}, "name": "{name}", "ok": true}}')
    return lines


def _chat_and_code_words(rng: random.Random, count: int) -> list[str]:
    """Questions, invented words and letter-digit codes: the demo task's shapes."""
    lines = []
    for _ in range(count):
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        letters = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(rng.randint(2, 4)))
        code = f"{letters}-{rng.randint(0, 9999)}"
        lines.append(f"user\n{rng.choice(_QUESTIONS).format(name=word)}\nassistant\n{code}\n")
        lines.append(f"system\nYou are a helpful assistant. {rng.choice(_QUESTIONS).format(name=rng.choice(_NAMES))}")
    return lines


def build_corpus(lines_per_kind: int = 600) -> list[str]:
    """The fixed training text of the tokenizer (independent of the model seed)."""
    rng = random.Random(1234)
    corpus = _english_lines(rng, lines_per_kind)
    corpus += _code_lines(rng, lines_per_kind // 3)
    corpus += _chat_and_code_words(rng, lines_per_kind // 2)
    corpus += [" ".join(str(n) for n in range(start, start + 10)) for start in range(0, 200, 10)]
    return corpus


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `build_corpus()`, wrapped for transformers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(build_corpus(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # Offsets stay untrimmed so character spans map exactly onto tokens; BOS is
    # prepended like Llama's tokenizer does for plain text.
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A $B",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[TURN_START_TOKEN],
        model_max_length=2048,
        padding_side="right",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(
    out_dir: Path,
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    intermediate_size: int = 192,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    lm_head_init_std: float = 0.5,
) -> Path:
    """Write a random-weight Llama causal LM and its tokenizer into `out_dir`.

    The output head is untied and drawn wider than the usual 0.02: behind the
    frozen final RMSNorm a 0.02 head can only produce logits of about +-1, so
    no adapter could ever make a prediction confident. The same arguments give
    byte-identical weights (the tokenizer never depends on `seed`).
    Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A private generator keeps the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, lm_head_init_std)
    return save_model_folder(model, tokenizer, out_dir)


def save_model_folder(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> Path:
    """`model` and `tokenizer` written as a hub model folder, the generation config's special
    token ids taken from the tokenizer. Returns `out_dir`."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
