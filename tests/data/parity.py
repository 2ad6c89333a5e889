#!/usr/bin/env python3
"""Token-for-token parity of Tetra's byte-level BPE with the reference implementations.

    parity.py --tetra DRIVER --case hf|tetra|gpt2 [--workdir DIR]

DRIVER is any executable whose arguments are those of `tetra tokenizer` (the tetra binary
with "tokenizer" as first argument, or tests/data's tt_tokenizer_driver).
Cases:
  hf     vocabulary trained by Hugging Face `tokenizers` (ByteLevel BPE), read by Tetra as
         tokenizer.json and as vocab.json + merges.txt
  tetra  vocabulary trained by `tetra tokenizer train`, read by `tokenizers`
  gpt2   GPT-2's vocabulary (gpt2.tiktoken from the openai-whisper package) vs `tiktoken`
Exits 77 (skip) when a reference package or the GPT-2 rank file is missing.
"""
import argparse
import glob
import os
import random
import subprocess
import sys
import tempfile

SKIP = 77
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_text() -> bytes:
    """Varied text: scripts, emoji, CJK, whitespace runs, digits, contractions, specials,
    long runs (the heap merge path), and ill-formed UTF-8."""
    parts = [
        "Hello world! It's 2024; we've got   three spaces, they'll see, I'd say, you're ok.",
        "DON'T SHOUT: I'M HERE. 'S 'T 'quoted' '''s x's y''s",
        "Numbers: 0 12 345 6789 3.14159 1,000,000 -42 +7 ½ ² Ⅻ ٣٤٥ ４５６ ९८७",
        "Ünïcödé façade naïve coöperate — “curly quotes” ‘single’ «guillemets»",
        "Ελληνικά κείμενο, русский текст, עברית, العربية, हिन्दी भाषा, ภาษาไทย, ქართული",
        "日本語のテキストと中文文本，한국어 텍스트。全角スペース　あり",
        "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🤖",
        "Tabs\tand\t\ttabs, newlines\n\n\nand CRLF\r\nline\x0bvertical\x0cform",
        "NBSP\u00a0here, em\u2003space, ideographic\u3000space, NEL\u0085, LS\u2028PS\u2029",
        "trailing spaces    \n    leading spaces\n\t\n  \n",
        "code: def f(x): return x**2 + 1  # comment\n    if (a && b) { c[i] += 1; }",
        "<|endoftext|>special in the middle<|endoftext|><|endoftext|> done",
        "a" * 700 + " " + "汉字" * 200 + " " + "1234567890" * 40 + " " + "!?" * 300,
        "mixed123abc ABC123 x1y2z3 __init__ snake_case camelCase URL https://example.com/a?b=c",
    ]
    text = "\n".join(parts).encode("utf-8")
    bad = [b"\xff", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
           b"\xf0\x9f\x98", b"\x80\x80", b"\xe0\x80\xaf"]
    out = bytearray()
    for i, b in enumerate(bad):
        out += b"invalid" + str(i).encode() + b" " + b + b"bytes "
    return text + b"\n" + bytes(out) + b"   \n\n  "


def corpus_text() -> str:
    """A small deterministic training corpus with repeated words in several scripts."""
    rng = random.Random(1234)
    syll = ["ka", "to", "ri", "ne", "su", "mo", "la", "pe", "the", "and", "ing", "tion", "er",
            "über", "ça", "пр", "ив", "ет", "日本", "語", "中", "文", "😀", "42", "7", "'s", "'ll"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        line = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.2:
            line += rng.choice([".", "!", "?", ",", "  ", "\t", " 123", " 4.5"])
        lines.append(line)
    sample = test_text().decode("utf-8", "replace")
    return "\n".join(lines) + "\n" + sample * 3


class Checker:
    def __init__(self, driver):
        self.driver = driver
        self.failures = 0

    def tetra_encode(self, tok_args, data: bytes, whole: bool):
        cmd = self.driver + ["encode"] + tok_args + (["--whole"] if whole else [])
        res = subprocess.run(cmd, input=data, capture_output=True)
        if res.returncode != 0:
            raise SystemExit(f"driver failed: {' '.join(cmd)}\n{res.stderr.decode()}")
        lines = res.stdout.decode().split("\n")[:-1]
        return [[int(x) for x in line.split()] for line in lines]

    def compare(self, name, got, want):
        if got == want:
            print(f"ok   {name}: {len(want)} ids")
            return
        self.failures += 1
        n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"FAIL {name}: first difference at id {n}: tetra {got[max(0, n-3):n+5]} "
              f"reference {want[max(0, n-3):n+5]} (lengths {len(got)} / {len(want)})")

    def run(self, name, tok_args, data: bytes, ref_encode):
        text = data.decode("utf-8", "replace")
        got = self.tetra_encode(tok_args, data, True)
        self.compare(f"{name} whole text", got[0] if got else [], ref_encode(text))
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        got = self.tetra_encode(tok_args, data, False)
        want = [ref_encode(line.decode("utf-8", "replace")) for line in lines]
        if len(got) != len(want):
            self.failures += 1
            print(f"FAIL {name} per line: {len(got)} lines, reference {len(want)}")
            return
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        if bad:
            self.failures += 1
            i = bad[0]
            print(f"FAIL {name} per line: {len(bad)} of {len(want)} lines differ, first line {i + 1}:"
                  f" tetra {got[i][:12]} reference {want[i][:12]}")
        else:
            print(f"ok   {name} per line: {len(want)} lines")

    def roundtrip(self, name, tok_args, data: bytes):
        ids = self.tetra_encode(tok_args, data, True)[0]
        cmd = self.driver + ["decode"] + tok_args
        res = subprocess.run(cmd, input=(" ".join(map(str, ids)) + "\n").encode(), capture_output=True)
        want = data.decode("utf-8", "replace").encode("utf-8") + b"\n"
        if res.returncode != 0 or res.stdout != want:
            self.failures += 1
            print(f"FAIL {name} round trip ({res.stderr.decode().strip()})")
        else:
            print(f"ok   {name} round trip: {len(want)} bytes")


def extra_texts():
    """Larger natural text when the Debian fortune files are installed."""
    files = sorted(glob.glob("/usr/share/games/fortunes/*.u8")) or \
        sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if "." not in os.path.basename(f))
    data = b""
    for f in files:
        with open(f, "rb") as fh:
            data += fh.read()
        if len(data) > 400_000:
            break
    return data


def case_hf(chk, work):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(corpus_text())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus], trainer)
    path = os.path.join(work, "hf_tokenizer.json")
    tok.save(path)
    tok.model.save(work, "hf")
    enc = lambda s: tok.encode(s).ids
    data = test_text()
    chk.run("hf tokenizer.json", ["--tokenizer", path], data, enc)
    chk.run("hf vocab.json+merges.txt", ["--vocab", os.path.join(work, "hf-vocab.json"),
                                         "--merges", os.path.join(work, "hf-merges.txt")],
            data, enc)
    chk.roundtrip("hf", ["--tokenizer", path], data)
    big = extra_texts()
    if big:
        chk.run("hf fortunes", ["--tokenizer", path], big, enc)


def case_tetra(chk, work):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(corpus_text())
    out = os.path.join(work, "tetra_vocab")
    res = subprocess.run(chk.driver + ["train", "--vocab-size", "1200", "--threads", "2", "--out",
                                       out, corpus], capture_output=True)
    if res.returncode != 0:
        raise SystemExit("tetra tokenizer train failed:\n" + res.stderr.decode())
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    if tok.get_vocab_size() != 1200:
        chk.failures += 1
        print(f"FAIL trained vocabulary has {tok.get_vocab_size()} ids, wanted 1200")
    enc = lambda s: tok.encode(s).ids
    data = test_text()
    chk.run("tetra-trained, read by tokenizers", ["--tokenizer", os.path.join(out, "tokenizer.json")],
            data, enc)
    chk.run("tetra-trained vocab.json+merges.txt",
            ["--vocab", os.path.join(out, "vocab.json"), "--merges", os.path.join(out, "merges.txt")],
            data, enc)
    # vocab.json + merges.txt also load into tokenizers' BPE model and agree.
    from tokenizers import pre_tokenizers
    tok2 = Tokenizer(BPE.from_file(os.path.join(out, "vocab.json"), os.path.join(out, "merges.txt")))
    tok2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    text = data.decode("utf-8", "replace").replace("<|endoftext|>", "")
    chk.compare("tetra vocab.json+merges.txt in tokenizers", tok2.encode(text).ids,
                tok.encode(text).ids)
    chk.roundtrip("tetra-trained", ["--tokenizer", os.path.join(out, "tokenizer.json")], data)


def find_gpt2():
    env = os.environ.get("TETRA_GPT2_TIKTOKEN")
    if env and os.path.exists(env):
        return env
    hits = glob.glob(os.path.join(ROOT, ".deps", "**", "gpt2.tiktoken"), recursive=True)
    return hits[0] if hits else None


def case_gpt2(chk, work):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    path = find_gpt2()
    if not path:
        print("skip: gpt2.tiktoken not found (run tools/setup-python-refs or set TETRA_GPT2_TIKTOKEN)")
        sys.exit(1 if os.environ.get("CI") == "true" else SKIP)
    enc = tiktoken.Encoding("gpt2-file", pat_str=GPT2_PATTERN, mergeable_ranks=load_tiktoken_bpe(path),
                            special_tokens={"<|endoftext|>": 50256})
    ref = lambda s: enc.encode(s, allowed_special="all")
    data = test_text()
    chk.run("gpt2.tiktoken", ["--tokenizer", path], data, ref)
    chk.roundtrip("gpt2", ["--tokenizer", path], data)
    big = extra_texts()
    if big:
        chk.run("gpt2 fortunes", ["--tokenizer", path], big, ref)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tetra", required=True, help="driver command (space-separated)")
    ap.add_argument("--case", required=True, choices=["hf", "tetra", "gpt2"])
    ap.add_argument("--workdir")
    args = ap.parse_args()
    try:
        if args.case == "gpt2":
            import tiktoken  # noqa: F401
        else:
            import tokenizers  # noqa: F401
    except ImportError as e:
        print(f"skip: {e} (run tools/setup-python-refs)")
        return 1 if os.environ.get("CI") == "true" else SKIP
    chk = Checker(args.tetra.split())
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        {"hf": case_hf, "tetra": case_tetra, "gpt2": case_gpt2}[args.case](chk, work)
    if chk.failures:
        print(f"{chk.failures} parity check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
