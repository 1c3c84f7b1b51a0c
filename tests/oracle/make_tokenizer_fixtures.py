#!/usr/bin/env python3
"""Build the tokenizer fixtures under tests/fixtures/tokenizers/ (not run by CI).

Trains small BPE tokenizers with the Hugging Face `tokenizers` library on a few MB
of committable text from ../shared/datasets (Python docs, WordNet glosses, GSM8K,
WikiText-2) plus a hand-written multilingual sample, wires each one up like a real
MoE checkpoint's tokenizer.json (Qwen2, OLMoE/GPT-NeoX, Llama/Mixtral, Phi-3.5-MoE,
and two synthetic ones covering the remaining components), and records for each a
cases.json of reference encodings and decodings computed by `tokenizers` itself.

Every variant keeps its total vocabulary (model + added tokens) at <= 1000 ids so
the tiny test models (vocab_size 1024) can use it.

The trainer breaks some count ties in hash order, so a rerun may renumber part of a
vocabulary (misc-bpe's alphabet does); each variant's files stay consistent together.

Usage:  python3 tests/oracle/make_tokenizer_fixtures.py [--shared ../shared]
Needs:  tokenizers (0.23 used), transformers (5.x used, for tokenizer_config.json).
"""
import argparse
import json
import os
import shutil
import tempfile

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

MAX_VOCAB = 1000

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# A hand-written multilingual sample, repeated in the training text so that
# merges for multi-byte characters exist.
MULTILINGUAL = """\
我们今天去公园散步，天气很好。机器学习是人工智能的一个分支。中文文本需要分词。
我们的模型使用专家混合架构，每个专家都是一个前馈网络。
日本語のテキストです。東京は日本の首都です。ひらがなとカタカナ。
한국어 문장입니다. 서울은 한국의 수도입니다.
Привет, мир! Это тест токенизатора. Москва — столица России. Мы любим читать книги.
Καλημέρα κόσμε· η γλώσσα είναι ωραία. Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.
Ünïcödé façade café résumé naïve jalapeño Größe Straße déjà vu.
العربية لغة جميلة. हिन्दी भाषा। Tiếng Việt có dấu.
Emoji: 🤗 🚀 👍 ❤️ 😀 🎉 ✨
"""


def read_text(shared):
    """Collect a few MB of training text from committable sources."""
    d = os.path.join(shared, "datasets")
    parts = []
    with open(os.path.join(d, "corpus/python3.11-doc_rst_sources.txt"), encoding="utf-8") as f:
        parts.append(f.read(1_200_000))
    with open(os.path.join(d, "corpus/wordnet3.0_glosses.txt"), encoding="utf-8") as f:
        parts.append(f.read(500_000))
    with open(os.path.join(d, "gsm8k/train.jsonl"), encoding="utf-8") as f:
        n = 0
        for line in f:
            rec = json.loads(line)
            parts.append(rec["question"] + "\n" + rec["answer"] + "\n")
            n += 1
            if n >= 1500:
                break
    with open(os.path.join(d, "wikitext2/wiki.test.raw"), encoding="utf-8") as f:
        parts.append(f.read(500_000))
    parts.append(MULTILINGUAL * 60)
    text = "".join(parts)
    return [line for line in text.split("\n") if line.strip()]


LONG_PARAGRAPH = (
    "Mixture-of-experts models route each token to a small subset of feed-forward "
    "experts chosen by a learned gate. Because only the selected experts run, the "
    "compute per token stays close to that of a much smaller dense model, while the "
    "total number of parameters, and with it the capacity to memorise facts, grows "
    "with the number of experts. The price is memory: every expert must be stored "
    "somewhere, and on an edge device the experts rarely fit in fast memory at once. "
    "Systems such as EdgeMoE, HOBBIT and Fiddler therefore keep a cache of hot experts "
    "in GPU or DRAM, predict which experts the next layers will need, prefetch them "
    "while the current layer computes, and fall back to lower-precision copies when a "
    "miss would stall the pipeline. Tokenization is the very first step of this "
    "pipeline: the text is normalized, split into words, and each word is turned into "
    "sub-word units by byte-pair encoding, applying the lowest-ranked merge first until "
    "no merge applies. Getting it exactly right matters, since a single different id "
    "changes every activation that follows.")

COMMON_CASES = [
    "The quick brown fox jumps over the lazy dog. It wasn't me, they'd said; we'll see what you've done!",
    "def fib(n):\n    if n < 2:\n        return n\n\treturn fib(n - 1) + fib(n - 2)  # recursion\n\n"
    "class Foo(object):\n\tdef __init__(self):\n\t\tself.x = {'a': [1, 2, 3]}\n\nprint([fib(i) for i in range(10)])\n",
    "3.14159 1,234,567 2024-11-21 0x1F 1e-9 42nd 100% $19.99 12345678901234567890",
    "我们今天去公园散步，天气很好。机器学习是人工智能的一个分支。",
    "Привет, мир! Это тест токенизатора.",
    "Καλημέρα κόσμε· η γλώσσα είναι ωραία.",
    "I \u2764\ufe0f tokenizers \U0001F917\U0001F680\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "Cafe\u0301 re\u0301sume\u0301 na\u0308ive \u212b A\u030a \ufb01 \u2460 \uff21\uff22 \u1e9b\u0323",
    "  leading spaces\tand\ttabs\n\n\nmultiple   spaces   here   \n  trailing   ",
    "",
    " ",
    "\n",
    "\U00020000\U0002A6A5\u9f98 \u9f49 \u9c7b and \U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522",
    LONG_PARAGRAPH,
    "English, 中文, 日本語のテキスト, 한국어, العربية, हिन्दी, Ελληνικά, Русский.",
    "DON'T I'LL She'S they're We'VE i'm you'd 'tis",
    "line1\r\nline2\rline3\n\n  \n\tindented\u2028sep\u2029para\x85nel",
    "tab\there\x01soh\x07bell\u00a0nbsp\u2003emsp\u200bzwsp\u3000ideo",
    "<s> </s> <unk> <|endoftext|> <|im_start|> <|user|> [INST]",
    "İstanbul ΣΊΣΥΦΟΣ ǅemal ß ẞ ﬃ Ⅻ",
    "a" * 300 + " " + "ab" * 150 + " " + "▁" * 5 + "end",
    "    ",
    "x  ",
    "<0x41> <0xE4> ▁▁ ▁hello",
    "digits ٣٤ ४२ ５６ ² ½ Ⅻ 7⃣",
]

VARIANT_CASES = {
    "qwen-bytelevel": [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"
        "<|im_start|>assistant\n",
        "text<|endoftext|>more<|endoftext|><|endoftext|> <|im_end|> trailing",
        "<|im_start|<|im_end|>>",
    ],
    "neox-bytelevel": [
        "Contact |||EMAIL_ADDRESS||| or |||IP_ADDRESS|||<|endoftext|>",
        "def f():\n        return 1\n    pass\n            deep",
        "<|padding|><|padding|>x<|endoftext|>y",
        "|||PHONE_NUMBER||||||PHONE_NUMBER|||",
    ],
    "llama-spbpe": [
        "<s>[INST] Hello [/INST] Hi</s><s>[INST] again [/INST]",
        " <s> spaced </s> ",
        "<unk><s></s>",
    ],
    "phi-spbpe": [
        "<|user|>\nWhat is 2+2? <|end|>\n<|assistant|>  4<|end|>",
        "<|system|> You are a bot.<|end|><|endoftext|>",
        "word<|tool|>word <|tool|> x\t<|tool|>",
        "  <|end|>  spaces   <|end|>",
        "<s>bos in text</s>",
        " leading space",
    ],
    "misc-bpe": [
        "Hello, World! Don't stop-believing... 1234 5678.",
        "  MiXeD   CaSe\tWITH   Spaces  ",
        "<cls> inline <sep> tokens <mask> here",
    ],
    "split-bpe": [
        "well-known state-of-the-art e-mail",
        "abc123def 45 6a7b8c ...!? ;;",
        "room 101, floor 9; code A-7-B",
    ],
}


def extra_cases(shared):
    """The first 20 C4 documents and 5 WikiText-2 paragraphs, truncated to ~500 chars."""
    out = []
    with open(os.path.join(shared, "datasets/c4/c4_validation_2k.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 20:
                break
            out.append(json.loads(line)["text"][:500])
    with open(os.path.join(shared, "datasets/wikitext2/wiki.test.raw"), encoding="utf-8") as f:
        paras = [p for p in f.read().split("\n") if len(p) > 200]
    out += [p[:500] for p in paras[:5]]
    return out


def train_bytelevel(lines, vocab_size, pre_tokenizer, special_tokens=()):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=list(special_tokens))
    tok.train_from_iterator(lines, trainer=tr)
    tok.decoder = decoders.ByteLevel()
    return tok


def build_qwen(lines):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok = train_bytelevel(lines, 900, pre)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    cfg = dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    return tok, cfg, False


def build_neox(lines):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok = train_bytelevel(lines, 900, pre, special_tokens=("<|endoftext|>", "<|padding|>"))
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A $B <|endoftext|>",
                                      special_tokens=[("<|endoftext|>", eos)]),
    ])
    # OLMoE/GPT-NeoX keep PII placeholders and runs of spaces as normalized,
    # non-special added tokens.
    tok.add_tokens([AddedToken(t, special=False, normalized=True)
                    for t in ("|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||", "|||IP_ADDRESS|||",
                              " " * 8, " " * 4)])
    cfg = dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|padding|>")
    return tok, cfg, True


def train_sentencepiece_bpe(lines):
    """BPE on ▁-joined words, re-indexed Llama style: <unk> <s> </s>, <0x00>..<0xFF>, pieces."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=680, min_frequency=2, limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(lines, trainer=tr)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    return vocab, merges


def build_spbpe(vocab, merges, phi):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    if phi:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([
            decoders.ByteFallback(),
            decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    if phi:
        tok.add_special_tokens([
            AddedToken("<|endoftext|>", special=True, normalized=False),
            AddedToken("<|assistant|>", special=True, normalized=False, rstrip=True),
            AddedToken("<|user|>", special=True, normalized=False, rstrip=True),
            AddedToken("<|end|>", special=True, normalized=False, lstrip=True, rstrip=True),
        ])
        tok.add_tokens([
            AddedToken("<|system|>", special=False, normalized=False),
            AddedToken("<|tool|>", special=False, normalized=False, single_word=True),
        ])
        cfg = dict(bos_token="<s>", eos_token="<|endoftext|>", unk_token="<unk>", pad_token="<|endoftext|>")
    else:
        cfg = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    return tok, cfg, phi


def build_misc(lines):
    """Lowercasing, NFKD, end-of-word suffix, continuing prefix, unk without byte fallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(r"\s+"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(behavior="isolated")])
    tr = trainers.BpeTrainer(vocab_size=700, min_frequency=2, limit_alphabet=80, show_progress=False,
                             continuing_subword_prefix="##", end_of_word_suffix="</w>",
                             special_tokens=["<unk>", "<cls>", "<sep>", "<mask>"])
    tok.train_from_iterator(lines, trainer=tr)
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    tok.post_processor = processors.RobertaProcessing(("<sep>", tok.token_to_id("<sep>")),
                                                      ("<cls>", tok.token_to_id("<cls>")))
    tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=False, lstrip=True)])
    cfg = dict(bos_token="<cls>", eos_token="<sep>", unk_token="<unk>", mask_token="<mask>")
    return tok, cfg, False


def build_split(lines):
    """The Split pre-tokenizer's behaviours (and invert), with byte-level BPE underneath."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\d"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[a-z]+"), behavior="merged_with_previous", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
    ])
    tok = train_bytelevel(lines, 600, pre, special_tokens=("[CLS]", "[SEP]"))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    cfg = dict(bos_token="[CLS]", eos_token="[SEP]")
    return tok, cfg, False


def to_legacy_merges(path):
    """Rewrite merges from [["a","b"], ...] to the legacy "a b" spelling."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    merges = []
    for a, b in j["model"]["merges"]:
        assert " " not in a and " " not in b, (a, b)
        merges.append(a + " " + b)
    j["model"]["merges"] = merges
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)


def write_variant(out_dir, name, tok, cfg, legacy, cases):
    from transformers import PreTrainedTokenizerFast

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    total = tok.get_vocab_size(with_added_tokens=True)
    max_id = max(tok.get_vocab(with_added_tokens=True).values())
    assert total <= MAX_VOCAB and max_id < MAX_VOCAB, (name, total, max_id)

    # tokenizer_config.json exactly as transformers saves it. transformers 5.x writes no
    # add_bos_token/add_eos_token: whether BOS/EOS are added is the post_processor's
    # business in tokenizer.json, which both transformers and the C tokenizer follow.
    with tempfile.TemporaryDirectory() as tmp:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, **cfg)
        fast.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "tokenizer_config.json"), os.path.join(d, "tokenizer_config.json"))
    path = os.path.join(d, "tokenizer.json")
    tok.save(path, pretty=True)
    if legacy:
        to_legacy_merges(path)
    # The reference is whatever the tokenizers library makes of the file on disk.
    ref = Tokenizer.from_file(path)
    with open(path, encoding="utf-8") as f:
        merges = json.load(f)["model"]["merges"]
    assert merges and isinstance(merges[0], str) == legacy, name

    records = []
    for text in cases:
        ids = ref.encode(text, add_special_tokens=True).ids
        ids_ns = ref.encode(text, add_special_tokens=False).ids
        records.append({
            "text": text,
            "ids": ids,
            "ids_no_special": ids_ns,
            "decoded": ref.decode(ids, skip_special_tokens=True),
            "decoded_with_special": ref.decode(ids, skip_special_tokens=False),
        })
    # What transformers makes of the saved directory: it must agree with the
    # tokenizers library, and its BOS/EOS ids are what moe_tokenizer_bos/eos return.
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(d)
    for r in records:
        assert hf(r["text"]).input_ids == r["ids"], (name, r["text"])
        assert hf(r["text"], add_special_tokens=False).input_ids == r["ids_no_special"], (name, r["text"])
    meta = {"vocab_size": total, "bos_id": -1 if hf.bos_token_id is None else hf.bos_token_id,
            "eos_id": -1 if hf.eos_token_id is None else hf.eos_token_id,
            "special_ids": sorted(ref.token_to_id(t.content) for t in ref.get_added_tokens_decoder().values()
                                  if t.special)}
    with open(os.path.join(d, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
        f.write("\n")
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        # One case per line: small diffs when the fixtures are regenerated.
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n]\n")
    print("%-16s vocab %4d (max id %d), %d merges, %d cases" % (name, total, max_id, len(merges), len(records)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(repo), "shared"))
    ap.add_argument("--out", default=os.path.join(repo, "tests/fixtures/tokenizers"))
    args = ap.parse_args()

    lines = read_text(args.shared)
    extra = extra_cases(args.shared)
    vocab, merges = train_sentencepiece_bpe(lines)
    builders = {
        "qwen-bytelevel": lambda: build_qwen(lines),
        "neox-bytelevel": lambda: build_neox(lines),
        "llama-spbpe": lambda: build_spbpe(vocab, merges, phi=False),
        "phi-spbpe": lambda: build_spbpe(vocab, merges, phi=True),
        "misc-bpe": lambda: build_misc(lines),
        "split-bpe": lambda: build_split(lines),
    }
    for name, build in builders.items():
        tok, cfg, legacy = build()
        write_variant(args.out, name, tok, cfg, legacy, COMMON_CASES + VARIANT_CASES[name] + extra)


if __name__ == "__main__":
    main()
