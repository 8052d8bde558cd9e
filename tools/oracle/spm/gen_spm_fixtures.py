#!/usr/bin/env python3
"""Train small SentencePiece models offline and dump encode/decode vectors for the Rust tests.

Run from the repository root:

    $ORACLE_VENV/bin/python tools/oracle/spm/gen_spm_fixtures.py

(any Python with `sentencepiece==0.2.*` works). Writes `fixtures/spm/*.model` and `fixtures/spm/*.json`.
The output is byte-identical across runs: the corpus is generated deterministically and training runs
single-threaded in a temporary directory with relative paths (the trainer spec records them).
"""

import json
import os
import random
import shutil
import sys
import tempfile

import sentencepiece as spm

OUT = os.path.join("fixtures", "spm")

WORDS_EN = (
    "the quick brown fox jumps over a lazy dog while moshi listens and speaks at the same time "
    "speech language model streaming audio codec tokens frame per second hello world how are you "
    "today thank you very much good morning evening night weather music talking about science history "
    "computer program rust python inference engine native fast small large number seven twelve"
).split()
WORDS_FR = "café crème élève garçon noël être très déjà où là-bas forêt hôpital naïve français".split()
WORDS_DE = "über straße grüße schön mädchen größe fußball äpfel".split()
WORDS_ES = "niño mañana corazón canción años señor".split()
CJK = ["你好", "世界", "我们", "语言", "模型", "こんにちは", "ありがとう", "東京", "日本語", "안녕하세요"]
EMOJI = ["😀", "🎉", "👍", "❤️", "🚀", "🐟"]
NUMBERS = ["1", "2", "42", "2024", "3.14", "100", "7"]
# Where each corpus word comes from: the first source whose cumulative bound exceeds a uniform draw.
WORD_MIX = [
    (0.62, WORDS_EN),
    (0.74, WORDS_FR),
    (0.80, WORDS_DE),
    (0.85, WORDS_ES),
    (0.91, CJK),
    (0.95, NUMBERS),
    (1.0, EMOJI),
]


def corpus_lines(n: int) -> list[str]:
    rng = random.Random(1234)
    lines = []
    for _ in range(n):
        words = []
        for _ in range(rng.randint(4, 14)):
            r = rng.random()
            source = next(pool for bound, pool in WORD_MIX if r < bound)
            words.append(rng.choice(source))
        line = " ".join(words)
        if rng.random() < 0.3:
            line = line[0].upper() + line[1:]
        if rng.random() < 0.4:
            line += rng.choice([".", "!", "?", ","])
        lines.append(line)
    return lines


# Characters that are deliberately absent from the corpus (unknown / byte fallback cases).
PROBES = [
    "",
    "hello world",
    "Hello world, how are you today?",
    "  leading and trailing spaces  ",
    "many     spaces\tand\ttabs\nnewline",
    "café crème, très déjà naïve",
    "straße über größe",
    "numbers 12345 and 3.14159",
    "unseen zyxwvq words xylophone",
    "你好世界 我们的语言模型",
    "東京は日本語で 안녕하세요",
    "emoji 😀🎉 rocket 🚀 fish 🐟",
    "rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ǅ Ω",
    "fullwidth ＡＢＣ１２３ and ligature ﬁne ½",
    "combining e\u0301 vs é",
    "literal <s> and </s> and <unk> text",
    "▁already▁escaped",
    "x",
    " ",
    "ñ",
    "ŋ",
    "🦀",
    "moshi says <laugh> hello",
    "<laugh><laugh>moshimoshi the",
    "Ab c　d e",
]


def train(name: str, corpus: str, tmp: str, **kw) -> str:
    args = dict(
        input=corpus,
        model_prefix=name,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    args.update(kw)
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        spm.SentencePieceTrainer.train(**args)
    finally:
        os.chdir(cwd)
    return os.path.join(tmp, name + ".model")


def piece_type(sp, i: int, user_defined: set[str]) -> str:
    if sp.is_unknown(i):
        return "unknown"
    if sp.is_control(i):
        return "control"
    if sp.is_byte(i):
        return "byte"
    if sp.is_unused(i):
        return "unused"
    if sp.id_to_piece(i) in user_defined:
        return "user_defined"
    return "normal"


def dump(name: str, model_path: str, model_type: str, byte_fallback: bool, user_defined: list[str]):
    shutil.copyfile(model_path, os.path.join(OUT, name + ".model"))
    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = sp.get_piece_size()
    ud = set(user_defined)
    vocab = [
        {"piece": sp.id_to_piece(i), "score": sp.get_score(i), "type": piece_type(sp, i, ud)}
        for i in range(n)
    ]
    encode = []
    for text in PROBES:
        ids = sp.encode(text)
        encode.append(
            {
                "text": text,
                "normalized": sp.normalize(text),
                "ids": ids,
                "pieces": sp.encode(text, out_type=str),
                "decoded": sp.decode(ids),
            }
        )
    # Random strings: corpus words mixed with characters the models rarely or never saw.
    rng = random.Random(7)
    pool = list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,!?'-") + [
        "  ", "\t", "\n", "\u3000", "\u00a0", "\u2581", "\u0301", "é", "ß", "ñ", "ø", "œ", "ﬁ", "Ａ", "１",
        "½", "你", "好", "的", "語", "안", "😀", "🦀", "\U0001d518", "<s>", "<laugh>", "moshi",
    ]
    words = WORDS_EN + WORDS_FR + WORDS_DE + WORDS_ES + CJK + EMOJI + NUMBERS
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.5:
                parts.append(rng.choice(words))
            else:
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 4))))
            parts.append(rng.choice([" ", " ", " ", "", "  "]))
        text = "".join(parts)
        ids = sp.encode(text)
        encode.append({"text": text, "normalized": sp.normalize(text), "ids": ids,
                       "decoded": sp.decode(ids)})
    # Decode vectors: random id sequences (byte pieces that may form broken UTF-8, control ids, unknown).
    rng = random.Random(99)
    byte_ids = [i for i in range(n) if sp.is_byte(i)]
    decode = []
    for k in range(40):
        length = rng.randint(0, 12)
        ids = []
        for _ in range(length):
            r = rng.random()
            if byte_ids and r < 0.35:
                ids.append(rng.choice(byte_ids))
            elif r < 0.45:
                ids.append(rng.randint(0, 3))
            else:
                ids.append(rng.randrange(n))
        decode.append({"ids": ids, "decoded": sp.decode(ids)})
    # Byte sequences that form valid multi-byte characters split over several pieces.
    if byte_ids:
        for s in ["é", "你", "😀", "aé😀b", "\u0301"]:
            ids = [sp.piece_to_id("<0x%02X>" % b) for b in s.encode("utf-8")]
            decode.append({"ids": ids, "decoded": sp.decode(ids)})
    meta = {
        "model": name + ".model",
        "model_type": model_type,
        "byte_fallback": byte_fallback,
        "vocab_size": n,
        "unk_id": sp.unk_id(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "pad_id": sp.pad_id(),
        "user_defined": user_defined,
        "vocab": vocab,
        "encode": encode,
        "decode": decode,
    }
    with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
        # One list element per line: compact, and diffs stay readable.
        f.write("{\n")
        for k, (key, value) in enumerate(meta.items()):
            sep = "," if k + 1 < len(meta) else ""
            if isinstance(value, list) and value and isinstance(value[0], dict):
                items = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
                f.write(f"{json.dumps(key)}: [\n{items}\n]{sep}\n")
            else:
                f.write(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{sep}\n")
        f.write("}\n")
    print(name, n, os.path.getsize(model_path), "bytes", file=sys.stderr)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "corpus.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(corpus_lines(3000)) + "\n")
        # Unigram, byte fallback, the default nmt_nfkc normalizer (like Moshi's tokenizer).
        p = train("unigram_bytes_nfkc", "corpus.txt", tmp, model_type="unigram", vocab_size=400,
                  byte_fallback=True)
        dump("unigram_bytes_nfkc", p, "unigram", True, [])
        # Unigram without byte fallback (unknown characters), identity normalizer, user-defined symbols.
        ud = ["<laugh>", "moshi"]
        p = train("unigram_identity", "corpus.txt", tmp, model_type="unigram", vocab_size=300,
                  normalization_rule_name="identity", user_defined_symbols=ud)
        dump("unigram_identity", p, "unigram", False, ud)
        # BPE with byte fallback, identity normalizer.
        p = train("bpe_bytes_identity", "corpus.txt", tmp, model_type="bpe", vocab_size=400,
                  byte_fallback=True, normalization_rule_name="identity")
        dump("bpe_bytes_identity", p, "bpe", True, [])
        # BPE without byte fallback, no dummy prefix, keep extra whitespace, identity normalizer,
        # user-defined symbols (kept whole, never merged).
        p = train("bpe_raw_ws", "corpus.txt", tmp, model_type="bpe", vocab_size=300,
                  normalization_rule_name="identity", add_dummy_prefix=False,
                  remove_extra_whitespaces=False, user_defined_symbols=ud)
        dump("bpe_raw_ws", p, "bpe", False, ud)
        # Character and word models (identity normalizer).
        p = train("char_identity", "corpus.txt", tmp, model_type="char", vocab_size=120,
                  normalization_rule_name="identity")
        dump("char_identity", p, "char", False, [])
        p = train("word_identity", "corpus.txt", tmp, model_type="word", vocab_size=120,
                  normalization_rule_name="identity", use_all_vocab=False)
        dump("word_identity", p, "word", False, [])


if __name__ == "__main__":
    main()
